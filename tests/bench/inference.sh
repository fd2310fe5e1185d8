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

py="${BENCH_PYTHON:-}"
if [[ -z "$py" ]]; then
  venv=.tools/bench-venv
  if [[ ! -x "$venv/bin/python" ]]; then
    echo "inference.sh: installing sentence-transformers into $venv (PyTorch is large; minutes)" >&2
    "${PYTHON:-python3}" -m venv "$venv"
  fi
  if ! "$venv/bin/python" -c "import sentence_transformers" 2>/dev/null; then
    "$venv/bin/python" -m pip --disable-pip-version-check -q install "sentence-transformers>=3,<7"
  fi
  py="$venv/bin/python"
fi

cargo build --release -p minions-tests --bin bench_inference
target/release/bench_inference --python "$py" --write "$@"
