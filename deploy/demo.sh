#!/usr/bin/env bash
# The demo: on a fresh Linux or macOS machine with Rust and python3, installs
# nats-server and the real models into .tools/, builds Minions, starts a
# local fleet (nats-server, watchdog, 2 workers), and
#   ./deploy/demo.sh        embeds a corpus of 12,000 sentences with
#                           all-MiniLM-L6-v2 into .minions-demo/vectors.npy;
#   ./deploy/demo.sh llm    answers 200 chat prompts with SmolLM2-135M-Instruct
#                           (GGUF, Q4_1) into .minions-demo/answers.jsonl;
#   ./deploy/demo.sh speech transcribes a folder of recordings (Debian's
#                           pocketsphinx clips, two of them over a minute)
#                           with Whisper tiny.en into
#                           .minions-demo/transcripts.jsonl and SubRip files
#                           in .minions-demo/subs/.
set -euo pipefail
cd "$(dirname "$0")/.."
source deploy/tools.sh
MODE="${1:-embed}"
if [[ "$MODE" != "embed" && "$MODE" != "llm" && "$MODE" != "speech" ]]; then
  echo "usage: deploy/demo.sh [embed|llm|speech]" >&2
  exit 2
fi
if [[ "$MODE" == "speech" ]]; then
  source deploy/speech_assets.sh
fi
N="${MINIONS_DEMO_SENTENCES:-12000}"
[[ "$MODE" == "llm" ]] && N="${MINIONS_DEMO_PROMPTS:-200}"
DEMO="$PWD/.minions-demo"
mkdir -p "$DEMO"

echo "== building Minions (release: the three binaries the demo runs)" >&2
# Only what the demo runs: not the tests, benchmarks or Python extension.
cargo build --release --quiet --bin minions --bin minions-worker --bin minions-watchdog
BIN="$PWD/target/release"

export MINIONS_STORE="file://$DEMO/store"
# The fleet logs at info into its log file; the CLI says only what matters.
export RUST_LOG="${RUST_LOG:-warn}"

if [[ "$MODE" == "llm" ]]; then
  echo "== writing $N chat prompts" >&2
  "$PWD/.tools/venv/bin/python" - "$N" > "$DEMO/prompts.jsonl" <<'PY'
import json, sys
topics = ["the moon", "coffee", "volcanoes", "jazz", "honeybees", "winter", "bread", "the ocean",
          "binary search", "lighthouses", "friendship", "electricity", "maps", "tea", "snow", "rivers"]
asks = ["Explain {} in one sentence.", "Give one surprising fact about {}.", "Write a haiku about {}."]
for i in range(int(sys.argv[1])):
    q = asks[i % len(asks)].format(topics[i % len(topics)])
    print(json.dumps({"id": f"q{i}", "messages": [{"role": "user", "content": q}]}))
PY
elif [[ "$MODE" == "speech" ]]; then
  echo "== gathering the recordings into .minions-demo/recordings/" >&2
  rm -rf "$DEMO/recordings"
  cp -r "$MINIONS_SPEECH_CLIPS" "$DEMO/recordings"
else
  echo "== writing a corpus of $N sentences" >&2
  "$PWD/.tools/venv/bin/python" deploy/make_corpus.py "$N" > "$DEMO/corpus.jsonl"
fi

echo "== starting a local fleet: nats-server on a free port, a watchdog, 2 workers (log: .minions-demo/fleet.log)" >&2
# --port 0: nats-server binds a port of its own choosing, and the fleet
# prints `export MINIONS_NATS_URL=...` once it listens.
RUST_LOG=info "$BIN/minions" dev --workers 2 --port 0 --data-dir "$DEMO/dev" > "$DEMO/fleet.log" 2>&1 &
FLEET=$!
trap 'kill -TERM $FLEET 2>/dev/null; wait $FLEET 2>/dev/null || true' EXIT
MINIONS_NATS_URL=""
for _ in $(seq 1 300); do
  MINIONS_NATS_URL="$(sed -n 's/^export MINIONS_NATS_URL=//p' "$DEMO/fleet.log" | head -n 1)"
  [[ -n "$MINIONS_NATS_URL" ]] && break
  if ! kill -0 "$FLEET" 2>/dev/null; then
    tail -n 30 "$DEMO/fleet.log" >&2
    echo "demo: the local fleet stopped at start (its log is above)" >&2
    exit 1
  fi
  sleep 0.1
done
if [[ -z "$MINIONS_NATS_URL" ]]; then
  tail -n 30 "$DEMO/fleet.log" >&2
  echo "demo: the local fleet did not start within 30 s (its log is above)" >&2
  exit 1
fi
export MINIONS_NATS_URL
echo "   nats-server at $MINIONS_NATS_URL" >&2

echo "== pushing the model" >&2
if [[ "$MODE" == "llm" ]]; then
  "$BIN/minions" model push "$MINIONS_TEST_GGUF" --name smollm2 2>/dev/null >/dev/null
elif [[ "$MODE" == "speech" ]]; then
  "$BIN/minions" model push "$MINIONS_WHISPER_TINY_EN" --name whisper 2>/dev/null >/dev/null
else
  "$BIN/minions" model push "$MINIONS_TEST_MODEL_DIR" --name minilm 2>/dev/null >/dev/null
fi
"$BIN/minions" model list

echo "== submitting" >&2
START=$(date +%s)
if [[ "$MODE" == "llm" ]]; then
  JOB="$("$BIN/minions" submit --model smollm2 --input "$DEMO/prompts.jsonl" --shard-size 25 --max-tokens 48 2>/dev/null)"
elif [[ "$MODE" == "speech" ]]; then
  JOB="$("$BIN/minions" submit --model whisper --input "$DEMO/recordings/" --shard-size 4 2>/dev/null)"
else
  JOB="$("$BIN/minions" submit --model minilm --input "$DEMO/corpus.jsonl" --shard-size 256 2>/dev/null)"
fi
echo "job: $JOB"
while true; do
  STATE="$("$BIN/minions" status "$JOB" --json 2>/dev/null | sed -n 's/^  "state": "\(.*\)",/\1/p')"
  "$BIN/minions" status "$JOB" 2>/dev/null | sed -n 's/^  shards /  /p'
  [[ "$STATE" == "done" || "$STATE" == "failed" ]] && break
  sleep 3
done
"$BIN/minions" status "$JOB"
if [[ "$MODE" == "llm" ]]; then
  "$BIN/minions" collect "$JOB" --output "$DEMO/answers.jsonl"
  END=$(date +%s)
  echo
  echo "Answered $N chat prompts with SmolLM2-135M-Instruct on 2 local workers in $((END - START)) s."
  echo "Answers (one JSON line per prompt, in input order): .minions-demo/answers.jsonl; the first three:"
  head -3 "$DEMO/answers.jsonl"
  exit 0
fi
if [[ "$MODE" == "speech" ]]; then
  "$BIN/minions" collect "$JOB" --output "$DEMO/transcripts.jsonl"
  rm -rf "$DEMO/subs"
  "$BIN/minions" collect "$JOB" --output "$DEMO/subs" --format srt
  END=$(date +%s)
  FILES=$(wc -l < "$DEMO/transcripts.jsonl")
  echo
  echo "Transcribed $FILES recordings with Whisper tiny.en on 2 local workers in $((END - START)) s."
  echo "Transcripts (one JSON line per file, in path order): .minions-demo/transcripts.jsonl; subtitles: .minions-demo/subs/"
  grep -h '"goforward.wav"\|"long/librivox_70s.wav"' "$DEMO/transcripts.jsonl" | cut -c1-300
  exit 0
fi
"$BIN/minions" collect "$JOB" --output "$DEMO/vectors.npy"
END=$(date +%s)
echo
echo "Embedded $N sentences with all-MiniLM-L6-v2 on 2 local workers in $((END - START)) s."
echo "Vectors (float32 [$N, 384], row i = line i of the corpus): .minions-demo/vectors.npy"
echo "Corpus: .minions-demo/corpus.jsonl   Store: .minions-demo/store   Fleet log: .minions-demo/fleet.log"
