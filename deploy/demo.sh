#!/usr/bin/env bash
# The demo: on a fresh Linux or macOS machine with Rust and python3, installs
# nats-server and the real all-MiniLM-L6-v2 weights into .tools/, builds
# Minions, starts a local fleet (nats-server, watchdog, 2 workers), embeds a
# corpus of 12,000 sentences and writes the vectors to .minions-demo/.
set -euo pipefail
cd "$(dirname "$0")/.."
source deploy/tools.sh
N="${MINIONS_DEMO_SENTENCES:-12000}"
DEMO="$PWD/.minions-demo"
mkdir -p "$DEMO"

echo "== building Minions (release)" >&2
cargo build --release --workspace --quiet
BIN="$PWD/target/release"

PORT="$("$PWD/.tools/venv/bin/python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
export MINIONS_NATS_URL="nats://127.0.0.1:$PORT"
export MINIONS_STORE="file://$DEMO/store"
# The fleet logs at info into its log file; the CLI says only what matters.
export RUST_LOG="${RUST_LOG:-warn}"

echo "== writing a corpus of $N sentences" >&2
"$PWD/.tools/venv/bin/python" deploy/make_corpus.py "$N" > "$DEMO/corpus.jsonl"

echo "== starting a local fleet: nats-server on port $PORT, a watchdog, 2 workers (log: .minions-demo/fleet.log)" >&2
RUST_LOG=info "$BIN/minions" dev --workers 2 --port "$PORT" --data-dir "$DEMO/dev" > "$DEMO/fleet.log" 2>&1 &
FLEET=$!
trap 'kill -TERM $FLEET 2>/dev/null; wait $FLEET 2>/dev/null || true' EXIT
for _ in $(seq 1 100); do
  (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null && break
  sleep 0.1
done

echo "== pushing the model" >&2
"$BIN/minions" model push "$MINIONS_TEST_MODEL_DIR" --name minilm 2>/dev/null >/dev/null
"$BIN/minions" model list

echo "== submitting" >&2
START=$(date +%s)
JOB="$("$BIN/minions" submit --model minilm --input "$DEMO/corpus.jsonl" --shard-size 256 2>/dev/null)"
echo "job: $JOB"
while true; do
  STATE="$("$BIN/minions" status "$JOB" --json 2>/dev/null | sed -n 's/^  "state": "\(.*\)",/\1/p')"
  "$BIN/minions" status "$JOB" 2>/dev/null | sed -n 's/^  shards /  /p'
  [[ "$STATE" == "done" || "$STATE" == "failed" ]] && break
  sleep 3
done
"$BIN/minions" status "$JOB"
"$BIN/minions" collect "$JOB" --output "$DEMO/vectors.npy"
END=$(date +%s)
echo
echo "Embedded $N sentences with all-MiniLM-L6-v2 on 2 local workers in $((END - START)) s."
echo "Vectors (float32 [$N, 384], row i = line i of the corpus): .minions-demo/vectors.npy"
echo "Corpus: .minions-demo/corpus.jsonl   Store: .minions-demo/store   Fleet log: .minions-demo/fleet.log"
