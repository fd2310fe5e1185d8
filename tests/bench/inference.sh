#!/usr/bin/env bash
# Inference benchmark: Minions' model code against sentence-transformers
# (PyTorch) on this machine, same texts and model, one run; writes the
# figures into BENCHMARKS.md. Not part of the test command.
#
#   bash tests/bench/inference.sh [bench_inference flags, e.g. --texts 1000]
#
# Installs sentence-transformers (and with it PyTorch, a large download) into
# .tools/bench-venv once; BENCH_PYTHON=/path/to/python uses an interpreter
# that has it already. The model comes from deploy/tools.sh.
set -euo pipefail
cd "$(dirname "$0")/../.."
source deploy/tools.sh --test

source tests/bench/venv.sh
bench_venv "sentence_transformers, numpy" "sentence-transformers>=3,<7" numpy

cargo build --release -p minions-tests --bin bench_inference
target/release/bench_inference --python "$py" --write "$@"
