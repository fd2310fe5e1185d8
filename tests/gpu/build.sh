#!/usr/bin/env bash
# Builds Minions for an NVIDIA GPU on a machine without one (no GPU, no CUDA
# toolkit needed): the CLI, the watchdog and the worker with
# `--features cuda`, in release, into target/cuda/release; then packs what
# tests/gpu/run.sh needs on the GPU machine (tests/gpu/pack.sh).
#
#   bash tests/gpu/build.sh            # CUDA_COMPUTE_CAP=80 (A100; H100/H200 by PTX)
#   CUDA_COMPUTE_CAP=90 bash tests/gpu/build.sh
#
# CUDA 13.0's compiler and headers come from PyPI, and the CUDA libraries
# are linked as stubs (tests/gpu/cuda_tools.sh); the GPU machine brings them.
# On 2 cores from a clean target: about 32 minutes, of which candle's CUDA
# kernels (nvcc, one compute capability) take 8 to 16.
set -euo pipefail
cd "$(dirname "$0")/../.."
source tests/gpu/cuda_tools.sh
# candle's kernel build runs nvcc on half the cores unless told.
export CUDAFORGE_THREADS="${CUDAFORGE_THREADS:-$(nproc)}"
start=$SECONDS
cargo build --release --target-dir target/cuda \
  -p minions -p minions-worker -p minions-watchdog --features minions-worker/cuda
echo "gpu: built target/cuda/release/{minions,minions-worker,minions-watchdog} for CUDA" \
  "(compute capability $CUDA_COMPUTE_CAP) in $((SECONDS - start)) s" >&2
bash tests/gpu/pack.sh
