#!/usr/bin/env bash
# Sourced by tests/gpu/build.sh and the test command (tests/run.sh):
# installs what building the worker with `--features cuda` needs on a
# machine with no GPU and no CUDA toolkit, into .tools/cuda (idempotent,
# about 200 MB unpacked), and exports CUDA_HOME, PATH and CUDA_COMPUTE_CAP.
#
# The compiler and headers come from NVIDIA's PyPI wheels of CUDA 13.0 (files
# only, no pip install): nvidia-cuda-nvcc, -crt, nvidia-nvvm, and
# nvidia-cuda-runtime (headers and libcudart, which candle's kernels link),
# nvidia-cuda-cccl. CUDA 12's wheels ship ptxas but no nvcc, so 13.0 it is:
# the oldest 13.x, for the widest driver support (a 580 driver or newer).
#
# No other CUDA library is needed to link. candle turns on cudarc's
# `dynamic-linking`, so the binary names libcuda.so.1, libcublas.so.13,
# libcublasLt.so.13, libcurand.so.10 and libnvrtc.so.13; the link is made
# against stubs of those names that export every function cudarc's bindings
# declare for them (as the toolkit's own lib64/stubs does for the driver).
# The stubs are never loaded: at run time the real libraries are found by
# name, the driver's libcuda and the others from a CUDA 13 toolkit or
# NVIDIA's cu13 wheels (PyTorch built for CUDA 13 brings them;
# tests/gpu/run.sh finds them).
#
# CUDA_COMPUTE_CAP (default 80): the GPU generation candle's statically
# built kernels (quantized products) are compiled for, as SASS plus PTX, so
# 80 runs on A100 (sm_80) natively and on H100/H200 (sm_90) through the
# driver's PTX compiler at first use; 90 compiles them for H100/H200 alone.
set -euo pipefail
_cuda_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/.tools/cuda"
_cuda_compiler=(
  "nvidia-cuda-nvcc==13.0.88" "nvidia-cuda-crt==13.0.88" "nvidia-nvvm==13.0.88"
  "nvidia-cuda-runtime==13.0.96" "nvidia-cuda-cccl==13.0.85"
)
_cuda_home="$_cuda_root/x/nvidia/cu13"
# Unpacks PyPI wheels (files only, no pip install) into .tools/cuda/x.
_cuda_fetch() {
  mkdir -p "$_cuda_root/wheels"
  "${PYTHON:-python3}" -m pip --disable-pip-version-check -q download --no-deps \
    -d "$_cuda_root/wheels" "$@"
  for w in "$_cuda_root"/wheels/*.whl; do
    "${PYTHON:-python3}" -m zipfile -e "$w" "$_cuda_root/x/"
  done
  rm -rf "$_cuda_root/wheels"
}
if [[ ! -f "$_cuda_root/.compiler" && ! -f "$_cuda_root/.done" ]]; then
  echo "cuda: fetching CUDA 13.0's compiler and headers (PyPI, about 100 MB)" >&2
  rm -rf "$_cuda_root"
  _cuda_fetch "${_cuda_compiler[@]}"
  chmod +x "$_cuda_home"/bin/* "$_cuda_home"/nvvm/bin/*
  touch "$_cuda_root/.compiler"
fi
# The link stubs: one shared library per name the binary links, exporting
# every function cudarc's bindings (the version in Cargo.lock) declare for it.
if [[ ! -f "$_cuda_root/.stubs" ]]; then
  cudarc="$(awk '/^name = "cudarc"$/ { getline; gsub(/"/, "", $3); print $3 }' \
    "$_cuda_root/../../Cargo.lock")"
  (cd "$_cuda_root/../.." && cargo fetch --quiet)
  bindings="$(ls -d "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/"cudarc-$cudarc" | head -n 1)/src"
  # In lib itself: cudarc's build script looks there (and in lib/stubs only
  # where that existed when it first ran). Only the linker reads these
  # unversioned names; the loader asks for the sonames, which are not here.
  # name, soname, cudarc's bindings
  while read -r name soname module; do
    grep -ohE 'pub unsafe fn [A-Za-z0-9_]+' "$bindings/$module/sys/mod.rs" \
      | sed 's/pub unsafe fn //' | sort -u | sed 's/.*/void &(void) {}/' \
      > "$_cuda_root/$name.c"
    # A folder from before the stubs may hold the name as a link to a real
    # library: replace the link, never write through it.
    rm -f "$_cuda_home/lib/lib$name.so"
    cc -shared -fPIC -Wl,-soname,"$soname" -o "$_cuda_home/lib/lib$name.so" \
      "$_cuda_root/$name.c"
    rm "$_cuda_root/$name.c"
  done <<'STUBS'
cuda libcuda.so.1 driver
cublas libcublas.so.13 cublas
cublasLt libcublasLt.so.13 cublaslt
curand libcurand.so.10 curand
nvrtc libnvrtc.so.13 nvrtc
STUBS
  # candle's kernels link the runtime by its unversioned name.
  ln -sf libcudart.so.13 "$_cuda_home/lib/libcudart.so"
  touch "$_cuda_root/.stubs"
fi
export CUDA_HOME="$_cuda_home"
export PATH="$_cuda_home/bin:$PATH"
export CUDA_COMPUTE_CAP="${CUDA_COMPUTE_CAP:-80}"
