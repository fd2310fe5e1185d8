#!/usr/bin/env bash
# Sourced by tests/gpu/build.sh: installs what building the worker with
# `--features cuda` needs on a machine with no GPU and no CUDA toolkit, into
# .tools/cuda (idempotent), and exports CUDA_HOME, PATH and CUDA_COMPUTE_CAP.
# Sourced with `--compiler-only` (the test command's lints of the CUDA
# build, tests/run.sh), it installs the compiler and headers alone (about
# 200 MB unpacked): enough to compile, not to link.
#
# Everything comes from NVIDIA's PyPI wheels of CUDA 13.0 (files only, no pip
# install): the compiler (nvidia-cuda-nvcc, -crt, nvidia-nvvm), headers
# (nvidia-cuda-runtime, nvidia-cuda-cccl) and, for the link only, the
# libraries candle links by name (cuBLAS, cuBLASLt, cuRAND, NVRTC, the CUDA
# runtime). CUDA 12's wheels ship ptxas but no nvcc, so 13.0 it is: the
# oldest 13.x, for the widest driver support (a 580 driver or newer).
#
# The driver library, libcuda.so.1, comes with the GPU's driver and has no
# wheel: the link is made against a stub of the same name that exports the
# driver functions cudarc declares (as the toolkit's own lib64/stubs does).
# At run time the real libraries are loaded by name: the driver's libcuda,
# and libcublas.so.13 and the others from a CUDA 13 toolkit or the same
# wheels (PyTorch built for CUDA 13 brings them; tests/gpu/run.sh finds them).
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
_cuda_libraries=(
  "nvidia-cublas==13.0.2.14" "nvidia-curand==10.4.0.35" "nvidia-cuda-nvrtc==13.0.88"
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
if [[ "${1:-}" != "--compiler-only" && ! -f "$_cuda_root/.done" ]]; then
  echo "cuda: fetching the CUDA 13.0 libraries candle links (PyPI, about 600 MB)" >&2
  _cuda_fetch "${_cuda_libraries[@]}"
  # The linker looks for the unversioned names.
  for so in "$_cuda_home"/lib/lib*.so.*; do
    base="${so%%.so.*}.so"
    [[ -e "$base" ]] || ln -s "$(basename "$so")" "$base"
  done
  # The driver stub: every cu* function cudarc's driver bindings declare.
  cudarc="$(awk '/^name = "cudarc"$/ { getline; gsub(/"/, "", $3); print $3 }' \
    "$_cuda_root/../../Cargo.lock")"
  (cd "$_cuda_root/../.." && cargo fetch --quiet)
  bindings="$(ls -d "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/"cudarc-$cudarc" | head -n 1)"
  bindings="$bindings/src/driver/sys/mod.rs"
  grep -oE 'pub unsafe fn cu[A-Za-z0-9_]+' "$bindings" | sed 's/pub unsafe fn //' | sort -u \
    | sed 's/.*/void &(void) {}/' > "$_cuda_root/cuda_stub.c"
  mkdir -p "$_cuda_home/lib/stubs"
  cc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$_cuda_home/lib/stubs/libcuda.so" \
    "$_cuda_root/cuda_stub.c"
  touch "$_cuda_root/.done"
fi
export CUDA_HOME="$_cuda_home"
export PATH="$_cuda_home/bin:$PATH"
export CUDA_COMPUTE_CAP="${CUDA_COMPUTE_CAP:-80}"
# cudarc's build looks for the libraries in $CUDA_HOME/lib and lib/stubs.
