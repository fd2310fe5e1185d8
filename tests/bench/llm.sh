#!/usr/bin/env bash
# LLM generation benchmark: Minions (2 workers) against llama-server at its
# best --parallel, and the engine against llama-batched-bench, on this
# machine, one run; writes the figures into BENCHMARKS.md. Not part of the
# test command. Builds llama.cpp into .tools/ first (deploy/llama_cpp.sh,
# about 5 minutes on 2 cores; needs cmake and a C++ compiler).
#
#   bash tests/bench/llm.sh [bench_llm flags, e.g. --prompts 100]
set -euo pipefail
cd "$(dirname "$0")/../.."
source deploy/tools.sh --test
bin="$(bash deploy/llama_cpp.sh | tail -1)"
cargo build --release --workspace --bins
target/release/bench_llm --llama-bin "$bin" --write "$@"
