#!/usr/bin/env bash
# Speech benchmark through the fleet: the speech clips (the files
# bench_speech runs in process) copied ROUNDS times into a folder and
# transcribed as one job by a local fleet of one worker (`minions dev
# --workers 1 --slots 1`, shards of 8 files), timed from submit to done;
# then bench_speech in process at batch 8 on the same cores, side by side.
# Prints audio seconds per second for both. Not part of the test command.
#
#   cargo build -p minions -p minions-worker -p minions-watchdog -p minions-bench --bins
#   bash tests/bench/speech_fleet.sh [--model tiny.en|base] [--copies N] [--bin DIR]
#
# --bin names the folder of the built binaries (default target/debug: the
# engine is built optimised in every profile).
set -euo pipefail
cd "$(dirname "$0")/../.."
source deploy/speech_assets.sh >/dev/null
source deploy/tools.sh >/dev/null
model=tiny.en
copies=2
bin=target/debug
while [[ $# -gt 0 ]]; do
  case "$1" in
    --model) model="$2"; shift 2 ;;
    --copies) copies="$2"; shift 2 ;;
    --bin) bin="$2"; shift 2 ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) echo "speech_fleet.sh: unknown flag $1 (see --help)" >&2; exit 2 ;;
  esac
done
case "$model" in
  tiny.en) dir="$MINIONS_WHISPER_TINY_EN" ;;
  base) dir="$MINIONS_WHISPER_BASE" ;;
  *) echo "speech_fleet.sh: --model tiny.en or base" >&2; exit 2 ;;
esac
work="$(mktemp -d)"
trap 'kill -TERM "${fleet:-0}" 2>/dev/null; wait 2>/dev/null; rm -rf "$work"' EXIT
for i in $(seq 1 "$copies"); do
  mkdir -p "$work/in/copy$i"
  cp -r "$MINIONS_SPEECH_CLIPS"/. "$work/in/copy$i/"
done
export MINIONS_STORE="file://$work/store" RUST_LOG=warn
RUST_LOG=info "$bin/minions" dev --workers 1 --slots 1 --port 0 --dashboard off \
  --data-dir "$work/dev" > "$work/fleet.log" 2>&1 &
fleet=$!
for _ in $(seq 1 300); do
  MINIONS_NATS_URL="$(sed -n 's/^export MINIONS_NATS_URL=//p' "$work/fleet.log" | head -n 1)"
  [[ -n "$MINIONS_NATS_URL" ]] && break
  sleep 0.1
done
export MINIONS_NATS_URL
"$bin/minions" model push "$dir" --name whisper >/dev/null
start=$(date +%s.%N)
job="$("$bin/minions" submit --model whisper --input "$work/in/" --shard-size 8)"
"$bin/minions" watch "$job" >/dev/null 2>&1 || true
end=$(date +%s.%N)
audio="$("$bin/minions" status "$job" --json | sed -n 's/^  "audio_secs": \(.*\),/\1/p')"
files="$("$bin/minions" status "$job" --json | sed -n 's/^  "records": \(.*\),/\1/p')"
kill -TERM "$fleet"; wait "$fleet" 2>/dev/null || true
fleet=""
python3 - "$audio" "$start" "$end" "$files" "$model" <<'PY'
import sys
audio, start, end, files, model = float(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]), sys.argv[4], sys.argv[5]
print(f"fleet (1 worker, {model}): {files} files, {audio:.1f} s of audio in {end - start:.1f} s "
      f"(submit to done, upload and model load included): {audio / (end - start):.1f} audio s/s")
PY
"$bin/bench_speech" --model "$model" --batches 8 --rounds 1
