#!/usr/bin/env bash
# Packs what tests/gpu/run.sh needs on a GPU machine that has no Rust
# toolchain and no network: the binaries, nats-server, the two models (the
# embedding model's weights in f16, 45 MB), the fixtures and the scripts, as
# target/cuda/minions-gpu/ and as an xz tarball cut into pieces of at most
# 60 MiB (the GGUF alone is 98 MB), target/cuda/minions-gpu.tar.xz.NN.
#
#   bash tests/gpu/pack.sh [BIN_DIR]     # default: target/cuda/release
#
# On the GPU machine:
#   cat minions-gpu.tar.xz.* | tar xJ && bash minions-gpu/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
source deploy/tools.sh >/dev/null
src="${1:-target/cuda/release}"
out=target/cuda/minions-gpu
rm -rf "$out" target/cuda/minions-gpu.tar.xz.*
mkdir -p "$out/bin" "$out/models/minilm" "$out/fixtures/smollm2"
for b in minions minions-worker minions-watchdog; do
  [[ -x "$src/$b" ]] || { echo "pack: no $src/$b (tests/gpu/build.sh builds it)" >&2; exit 1; }
  cp "$src/$b" "$out/bin/"
done
cp "$NATS_SERVER_BIN" "$out/bin/nats-server"
strip "$out"/bin/* 2>/dev/null || true
cp tests/gpu/run.sh tests/gpu/report.py tests/gpu/cpu_answers.jsonl deploy/make_corpus.py "$out/"
cp tests/fixtures/minilm_reference.json "$out/fixtures/"
cp tests/fixtures/smollm2/greedy.json "$out/fixtures/smollm2/"
# The embedding model as sentence-transformers reads it, weights in f16.
(cd "$MINIONS_TEST_MODEL_DIR" && find . -type f ! -name model.safetensors ! -name '*.md' \
  ! -name .gitattributes -print0 | xargs -0 -I{} cp --parents {} "$OLDPWD/$out/models/minilm/")
"$_tools/venv/bin/python" tests/gpu/half_weights.py \
  "$MINIONS_TEST_MODEL_DIR/model.safetensors" "$out/models/minilm/model.safetensors"
cp "$MINIONS_TEST_GGUF" "$out/models/smollm2.gguf"
(cd target/cuda && tar cf - minions-gpu | xz -T0 -6 | split -b 60M -d - minions-gpu.tar.xz.)
du -sh "$out"/bin/* "$out"/models/* >&2
ls -l target/cuda/minions-gpu.tar.xz.* >&2
echo "pack: target/cuda/minions-gpu.tar.xz.* (on the GPU machine: cat minions-gpu.tar.xz.* | tar xJ && bash minions-gpu/run.sh)" >&2
