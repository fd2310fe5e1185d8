#!/usr/bin/env bash
# The peer figure for a model split across machines: llama.cpp's RPC split.
# SmolLM2-135M Q4_1 in llama-batched-bench (prompt 128, 32 generated tokens,
# 1 and 32 sequences), side by side in each round: the whole model in one
# process on 2 threads and on 1, and its layers split over two
# ggml-rpc-server processes of 1 thread each on loopback (-ngl 99 --rpc).
# The split efficiency is tokens/s(2 servers x 1 thread) / tokens/s(1
# process x 2 threads), as bench_split measures ours.
#   bash tests/bench/llama_rpc.sh [ROUNDS]     # default 3
# Needs cmake and a C++ compiler (deploy/llama_cpp.sh --rpc builds it).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
rounds="${1:-3}"
bin="$(bash "$root/deploy/llama_cpp.sh" --rpc | tail -1)"
source "$root/deploy/tools.sh" --test >/dev/null 2>&1 || true
model="${MINIONS_TEST_GGUF:?the test model (deploy/tools.sh --test sets MINIONS_TEST_GGUF)}"
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
servers=()
cleanup() { for p in "${servers[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT
# Generated tokens/s at 1 and 32 sequences, from batched-bench's table.
bench() {
  "$bin/llama-batched-bench" -m "$model" -c 8192 -b 2048 -ub 512 -npp 128 -ntg 32 -npl 1,32 "$@" 2>&1 \
    | awk -F'|' '$2+0==128 && $3+0==32 { gsub(/ /,"",$4); gsub(/ /,"",$9); printf "%s=%s ", $4, $9 }'
  echo
}
for r in $(seq 1 "$rounds"); do
  echo "round $r: 1 process x 2 threads: $(bench -t 2)"
  echo "round $r: 1 process x 1 thread: $(bench -t 1)"
  p1="$(port)"; p2="$(port)"
  "$bin/ggml-rpc-server" -H 127.0.0.1 -p "$p1" -t 1 >/dev/null 2>&1 & servers+=($!)
  "$bin/ggml-rpc-server" -H 127.0.0.1 -p "$p2" -t 1 >/dev/null 2>&1 & servers+=($!)
  sleep 1
  echo "round $r: 2 rpc-servers x 1 thread: $(bench -t 1 -ngl 99 --rpc "127.0.0.1:$p1,127.0.0.1:$p2")"
  cleanup; servers=()
done
