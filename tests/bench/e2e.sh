#!/usr/bin/env bash
# End-to-end benchmark: one embedding job through Minions (2 workers) against
# Ray Data (2 actors of sentence-transformers) on this machine, one run;
# writes the figures into BENCHMARKS.md. Not part of the test command.
#
#   bash tests/bench/e2e.sh [bench_e2e flags, e.g. --texts 1000]
#
# Installs sentence-transformers and Ray Data into .tools/bench-venv once
# (PyTorch and Ray are large downloads); BENCH_PYTHON=/path/to/python uses an
# interpreter that has them already. nats-server and the model come from
# deploy/tools.sh.
set -euo pipefail
cd "$(dirname "$0")/../.."
source deploy/tools.sh --test

source tests/bench/venv.sh
bench_venv "sentence_transformers, ray.data" "sentence-transformers>=3,<7" "ray[data]>=2.9"

cargo build --release --workspace --bins
target/release/bench_e2e --python "$py" --write "$@"
