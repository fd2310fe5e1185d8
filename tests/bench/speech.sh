#!/usr/bin/env bash
# Speech benchmark, the reference side: CTranslate2's Whisper (CPU, float32
# and int8) over the speech clips, window by window with segment timestamps,
# windows of several files batched, as tests/bench/src/bin/bench_speech.rs runs
# ours; audio seconds per second, printed. Not part of the test command.
#
#   bash tests/bench/speech.sh [speech_reference.py flags, e.g. --model base
#                               --batches 1,4,8 --threads 1,2 --rounds 2]
#
# Installs the speech assets (deploy/speech_assets.sh) and the venv
# .tools/ct2-venv of tests/fixtures/speech/make_goldens.sh (CTranslate2,
# numpy and tokenizers, binary wheels from PyPI) once each.
# BENCH_CT2_PYTHON=/path/to/python uses an interpreter that has them already.
# For ours on the same files: target/release/bench_speech (see its doc).
set -euo pipefail
cd "$(dirname "$0")/../.."
source deploy/speech_assets.sh

if [[ -n "${BENCH_CT2_PYTHON:-}" ]]; then
  py="$BENCH_CT2_PYTHON"
else
  source tests/bench/venv.sh
  bench_venv_in .tools/ct2-venv "ctranslate2, numpy, tokenizers" \
    --only-binary=:all: ctranslate2==4.8.5 numpy==2.4.6 tokenizers==0.23.3
fi
exec "$py" tests/bench/speech_reference.py "$@"
