#!/usr/bin/env bash
# Inference benchmark: Minions' model code against ONNX Runtime (the engine
# deployed for CPU embeddings) and sentence-transformers (PyTorch, the f32
# accuracy reference) on this machine, same texts and model, one run;
# writes the figures into BENCHMARKS.md. Not part of the test command.
#
#   bash tests/bench/inference.sh [bench_inference flags, e.g. --paths]
#
# Installs sentence-transformers into .tools/bench-venv, and optimum's ONNX
# exporter with onnxruntime into .tools/onnx-venv (its own: the exporter
# pins transformers < 4.58, sentence-transformers 6 needs >= 5), once each;
# PyTorch is a large download. BENCH_PYTHON=/path/to/python uses an
# interpreter that has sentence-transformers already, BENCH_ONNX_PYTHON one
# that has optimum-onnx and onnxruntime. The model comes from
# deploy/tools.sh; its ONNX export is made once into .tools/onnx-models.
set -euo pipefail
cd "$(dirname "$0")/../.."
source deploy/tools.sh --test

source tests/bench/venv.sh
bench_venv "sentence_transformers, numpy" "sentence-transformers>=3,<7" numpy
st_py="$py"
if [[ -n "${BENCH_ONNX_PYTHON:-}" ]]; then
  onnx_py="$BENCH_ONNX_PYTHON"
else
  bench_venv_in .tools/onnx-venv "optimum.exporters.onnx, onnxruntime, tokenizers" \
    "optimum-onnx>=0.1,<0.2" "onnxruntime>=1.32,<1.33"
  onnx_py="$py"
fi

# --fleet runs the workspace's release binaries.
cargo build --release --workspace --bins
target/release/bench_inference --python "$st_py" --onnx-python "$onnx_py" --write "$@"
