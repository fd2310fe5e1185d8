#!/usr/bin/env bash
# Shows that a worker built with `--features cuda` is a whole executable on a
# machine with no GPU: it names the CUDA libraries (so the feature took), and
# it starts with every symbol bound at load time (LD_BIND_NOW) against the
# real CUDA runtime and the link stubs that tests/gpu/cuda_tools.sh made,
# each under the soname the binary asks for. Nothing calls into CUDA:
# `--version` never opens a device.
#
#   source tests/gpu/cuda_tools.sh && bash tests/gpu/loads.sh target/debug/minions-worker
set -euo pipefail
bin="$1"
: "${CUDA_HOME:?source tests/gpu/cuda_tools.sh first}"
needed="$(readelf -d "$bin" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')"
if ! grep -qx 'libcuda.so.1' <<<"$needed"; then
  echo "cuda: $bin does not link libcuda.so.1: built without --features cuda?" >&2
  exit 1
fi
sonames="$(mktemp -d)"
trap 'rm -rf "$sonames"' EXIT
for so in "$CUDA_HOME"/lib/lib*.so; do
  soname="$(readelf -d "$so" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')"
  [[ -n "$soname" && ! -e "$CUDA_HOME/lib/$soname" ]] && ln -s "$so" "$sonames/$soname"
done
version="$(LD_LIBRARY_PATH="$sonames:$CUDA_HOME/lib" LD_BIND_NOW=1 "$bin" --version)"
echo "cuda: $version links $(grep -E 'libcu|libnv' <<<"$needed" | paste -sd ' ') and loads" >&2
