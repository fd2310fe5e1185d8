#!/usr/bin/env bash
# The GPU check: one command, on a machine with an NVIDIA GPU, Python, PyTorch
# and sentence-transformers (no Rust toolchain, no network), from the bundle
# tests/gpu/build.sh makes:
#
#   tar xf minions-gpu.tar.xz && bash minions-gpu/run.sh
#
# It starts a nats-server, a watchdog and one worker on the device, and prints:
#   - the canary's verdict on the device (`minions-worker doctor`);
#   - embeddings of a 20,000-text corpus as fleet jobs in f32 and f16 (and bf16
#     on a GPU, against sentence-transformers' fp32): texts/s
#     (submit to done, model loaded), max abs diff and cosine against the
#     committed sentence-transformers vectors and against sentence-transformers
#     on the same device, and sentence-transformers' own texts/s at its best
#     batch size in fp32 and fp16 (the ratio is the figure);
#   - SmolLM2-135M-Instruct: 200 chat prompts, greedy, up to 64 tokens each, as
#     fleet jobs at --max-seqs 32, 128 and 256: generated tokens/s, and how many
#     answers equal the CPU path's (tests/gpu/cpu_answers.jsonl) and how many
#     are the same at every width (batch independence);
#   - GPU memory in use (nvidia-smi) and the worker's peak RSS.
#
# Options:
#   --device D       the worker's device: cuda:0 (default), cpu or metal
#   --quick          512 texts, 16 prompts, --max-seqs 4 and 16: the dry run that
#                    the test command makes with --device cpu
#   --parts P        embed, llm or embed,llm (default); a part whose model is
#                    absent is skipped and says so
#   --out DIR        keep logs and outputs there (default: a temporary folder)
#   --widths "W..."  the --max-seqs values of the generation jobs
#   --worker-flags "F..."  more flags for every worker, e.g. "--max-batch 512
#                    --batch-tokens 65536" (the defaults, 128 texts and 8,192
#                    tokens a pass, are set for CPUs)
#   --write-answers  write the answers as the CPU path's fixture (made once with
#                    --device cpu --parts llm --widths 32 --write-answers)
# Binaries: the bundle's bin/, else $MINIONS_BIN, else target/release or
# target/debug; nats-server: the bundle's, $NATS_SERVER_BIN or PATH. Models:
# the bundle's models/, else $MINIONS_TEST_MODEL_DIR and $MINIONS_TEST_GGUF
# (source deploy/tools.sh). Exits 1 when a job fails, vectors disagree, or on
# the CPU when an answer differs from the fixture.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
DEVICE=cuda:0 QUICK=0 PARTS=embed,llm OUT="" WRITE=0 WIDTHS_SET="" WORKER_FLAGS=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --device) DEVICE="$2"; shift 2 ;;
    --quick) QUICK=1; shift ;;
    --parts) PARTS="$2"; shift 2 ;;
    --out) OUT="$2"; shift 2 ;;
    --write-answers) WRITE=1; shift ;;
    --widths) WIDTHS_SET="$2"; shift 2 ;;
    --worker-flags) WORKER_FLAGS="$2"; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done

# Where things are: a bundle (bin/ beside this script) or the repository.
if [[ -x "$here/bin/minions-worker" ]]; then
  BIN="$here/bin" FIX="$here/fixtures"
  NATS="$here/bin/nats-server"
  MODEL_DIR="$here/models/minilm" GGUF="$here/models/smollm2.gguf"
else
  root="$(cd "$here/../.." && pwd)"
  BIN="${MINIONS_BIN:-}"
  if [[ -z "$BIN" ]]; then
    BIN="$root/target/release"
    [[ -x "$BIN/minions-worker" ]] || BIN="$root/target/debug"
  fi
  FIX="$root/tests/fixtures"
  NATS="${NATS_SERVER_BIN:-$(command -v nats-server || true)}"
  MODEL_DIR="${MINIONS_TEST_MODEL_DIR:-}" GGUF="${MINIONS_TEST_GGUF:-}"
fi
PY="${PYTHON:-python3}"
ANSWERS_FIXTURE="$here/cpu_answers.jsonl"
for b in minions minions-worker minions-watchdog; do
  [[ -x "$BIN/$b" ]] || { echo "gpu: no $BIN/$b (build first: tests/gpu/build.sh)" >&2; exit 1; }
done
[[ -x "$NATS" ]] || { echo "gpu: no nats-server (set NATS_SERVER_BIN)" >&2; exit 1; }

# A CUDA worker loads CUDA 13's libraries by name: from the system, or from
# the nvidia/cu13 wheels a CUDA 13 PyTorch brings.
if [[ "$DEVICE" == cuda* ]]; then
  cu13="$("$PY" -c 'import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], "cu13", "lib"))' 2>/dev/null || true)"
  [[ -d "$cu13" ]] && export LD_LIBRARY_PATH="$cu13${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi

if [[ "$QUICK" == 1 ]]; then
  TEXTS=512 PROMPTS=16 WIDTHS="4 16" EMBED_SHARD=128
else
  TEXTS=20000 PROMPTS=200 WIDTHS="32 128 256" EMBED_SHARD=2000
fi
[[ -n "$WIDTHS_SET" ]] && WIDTHS="$WIDTHS_SET"
if [[ -z "$OUT" ]]; then OUT="$(mktemp -d -t minions-gpu-XXXXXX)"; fi
mkdir -p "$OUT"
export MINIONS_STORE="file://$OUT/store" RUST_LOG="${RUST_LOG:-info}"
FAILED=0
say() { echo "$*"; }
now() { date +%s.%N; }
calc() { awk "BEGIN { printf \"$1\", $2 }"; } # calc FORMAT EXPRESSION

pids=()
stop_all() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  pids=()
}
trap stop_all EXIT

say "== Minions GPU check: device $DEVICE$([[ $QUICK == 1 ]] && echo ', quick'), $(date -u +%Y-%m-%dT%H:%MZ)"
if command -v nvidia-smi >/dev/null 2>&1; then
  say "gpu: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | head -n 1)"
fi
say "out: $OUT"

# The canary, as a user checks a machine.
if "$BIN/minions-worker" doctor --device "$DEVICE" --nats nats://127.0.0.1:1 > "$OUT/doctor.txt" 2>&1; then :; fi
say "$(grep -E '^(device|canary|engine path) ' "$OUT/doctor.txt" || echo "doctor: no canary line (see $OUT/doctor.txt)")"
grep -qE '^canary +ok' "$OUT/doctor.txt" || FAILED=1

# nats-server with JetStream on a free port.
port="$("$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
"$NATS" -js -sd "$OUT/nats" -a 127.0.0.1 -p "$port" > "$OUT/nats.log" 2>&1 &
pids+=($!)
export MINIONS_NATS_URL="nats://127.0.0.1:$port"
for _ in $(seq 1 100); do
  (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
  sleep 0.1
done
"$BIN/minions-watchdog" --name gpu-watchdog --listen 127.0.0.1:0 --http-open > "$OUT/watchdog.log" 2>&1 &
pids+=($!)

WORKER=""
start_worker() { # start_worker NAME FLAGS...: one worker on the device, replacing any
  if [[ -n "$WORKER" ]]; then
    kill -TERM "$WORKER" 2>/dev/null || true
    wait "$WORKER" 2>/dev/null || true
  fi
  local name="$1"; shift
  # shellcheck disable=SC2086 # WORKER_FLAGS is a list of words
  "$BIN/minions-worker" --device "$DEVICE" --name "$name" --cache-dir "$OUT/cache" "$@" \
    $WORKER_FLAGS > "$OUT/$name.log" 2>&1 &
  WORKER=$!
  pids+=("$WORKER")
}
run_job() { # run_job NAME SUBMIT-FLAGS...: submits, waits; sets SECS
  local name="$1"; shift
  local t0 job
  t0="$(now)"
  job="$("$BIN/minions" submit --job "$name" "$@" 2>>"$OUT/cli.log")"
  if ! "$BIN/minions" watch "$job" >>"$OUT/cli.log" 2>&1; then
    say "$name: FAILED (the job did not finish; see $OUT/cli.log and the worker's log)"
    FAILED=1
    SECS=0
    return 1
  fi
  SECS="$(calc %.2f "$(now) - $t0")"
}
usage() { # the worker's peak RSS, and the GPU memory in use
  local rss gpu=""
  rss="$(awk '/VmHWM/ {print int($2/1024)}' "/proc/$WORKER/status" 2>/dev/null || echo '?')"
  if command -v nvidia-smi >/dev/null 2>&1; then
    gpu=", GPU memory in use $(nvidia-smi --query-gpu=memory.used --format=csv,noheader | head -n 1)"
  fi
  say "$1: worker peak RSS ${rss} MB$gpu"
}

if [[ ",$PARTS," == *,embed,* ]]; then
  if [[ -z "$MODEL_DIR" || ! -d "$MODEL_DIR" ]]; then
    say "embed: skipped (no model folder)"
  else
    say "== embeddings: all-MiniLM-L6-v2, $TEXTS texts, shards of $EMBED_SHARD"
    "$PY" "$here/report.py" corpus "$TEXTS" "$FIX/minilm_reference.json" "$OUT/texts.jsonl"
    "$BIN/minions" model push "$MODEL_DIR" --name minilm >>"$OUT/cli.log" 2>&1
    st_out=""
    if "$PY" -c 'import sentence_transformers, torch' 2>/dev/null; then
      st_device="$DEVICE"; [[ "$DEVICE" == metal ]] && st_device=mps
      "$PY" "$here/report.py" st "$MODEL_DIR" "$OUT/texts.jsonl" "$st_device" "$OUT/st" \
        || { say "sentence-transformers: FAILED"; FAILED=1; }
      st_out="$OUT/st"
    else
      say "sentence-transformers: not installed here; agreement with the committed vectors only"
    fi
    start_worker gpu-embed
    # bf16 on a GPU only: a CPU worker runs it as f32, as it does f16.
    precisions="f32 f16"
    [[ "$DEVICE" != cpu ]] && precisions+=" bf16"
    for precision in $precisions; do
      head -n 64 "$OUT/texts.jsonl" > "$OUT/warm.jsonl"
      run_job "warm-$precision" --model minilm --input "$OUT/warm.jsonl" --precision "$precision" || continue
      run_job "embed-$precision" --model minilm --input "$OUT/texts.jsonl" \
        --shard-size "$EMBED_SHARD" --precision "$precision" || continue
      "$BIN/minions" collect "embed-$precision" --output "$OUT/embed-$precision.npy" >>"$OUT/cli.log" 2>&1
      st_file=""
      [[ -n "$st_out" && -f "$st_out.fp32" ]] && st_file="$st_out.fp32"
      [[ "$precision" == f16 && -n "$st_out" && -f "$st_out.fp16" ]] && st_file="$st_out.fp16"
      say "Minions $precision: $(calc %.0f "$TEXTS / $SECS") texts/s through the fleet ($SECS s)"
      "$PY" "$here/report.py" embed "Minions $precision" "$OUT/embed-$precision.npy" \
        "$FIX/minilm_reference.json" $st_file || FAILED=1
    done
    usage "embed"
  fi
fi

if [[ ",$PARTS," == *,llm,* ]]; then
  if [[ -z "$GGUF" || ! -f "$GGUF" ]]; then
    say "llm: skipped (no GGUF file)"
  else
    say "== generation: SmolLM2-135M-Instruct Q4_1, $PROMPTS chat prompts, greedy, up to 64 tokens"
    "$PY" "$here/report.py" prompts "$PROMPTS" "$FIX/smollm2/greedy.json" "$OUT/prompts.jsonl"
    head -n 2 "$OUT/prompts.jsonl" > "$OUT/warm-prompts.jsonl"
    "$BIN/minions" model push "$GGUF" --name smollm2 >>"$OUT/cli.log" 2>&1
    first=1
    for width in $WIDTHS; do
      start_worker "gpu-llm-$width" --max-seqs "$width"
      run_job "warm-llm-$width" --model smollm2 --input "$OUT/warm-prompts.jsonl" \
        --max-tokens 8 --temperature 0 || continue
      run_job "llm-$width" --model smollm2 --input "$OUT/prompts.jsonl" \
        --shard-size "$PROMPTS" --max-tokens 64 --temperature 0 || continue
      "$BIN/minions" collect "llm-$width" --output "$OUT/answers-$width.jsonl" >>"$OUT/cli.log" 2>&1
      write=()
      [[ "$WRITE" == 1 && "$first" == 1 ]] && write=(--write)
      first=0
      line="$("$PY" "$here/report.py" answers "$OUT/answers-$width.jsonl" "$ANSWERS_FIXTURE" "${write[@]}")" \
        || FAILED=1
      summary="$(echo "$line" | tail -n 1)"
      tokens="$("$PY" -c 'import json,sys; print(json.loads(sys.argv[1])["tokens"])' "$summary")"
      same="$("$PY" -c 'import json,sys; print(json.loads(sys.argv[1])["equal_to_cpu"])' "$summary")"
      say "Minions --max-seqs $width: $(calc %.0f "$tokens / $SECS") generated tokens/s" \
        "($tokens tokens in $SECS s); $same of $PROMPTS answers equal the CPU path's"
      if [[ "$DEVICE" == cpu && "$same" != "$PROMPTS" ]]; then
        say "llm: FAILED: on the CPU every answer must equal the fixture's"
        FAILED=1
      fi
      usage "llm --max-seqs $width"
    done
    # Batch independence: a record's answer must not depend on how many
    # sequences share its passes (on a GPU, candle picks its quantized
    # product's kernel by the pass's rows).
    set -- $WIDTHS
    first_width="$1"
    shift
    for width in "$@"; do
      [[ -f "$OUT/answers-$first_width.jsonl" && -f "$OUT/answers-$width.jsonl" ]] || continue
      n="$("$PY" "$here/report.py" same "$OUT/answers-$width.jsonl" "$OUT/answers-$first_width.jsonl")"
      say "batch independence: $n of $PROMPTS answers at --max-seqs $width equal those at --max-seqs $first_width"
      if [[ "$DEVICE" == cpu && "$n" != "$PROMPTS" ]]; then
        say "llm: FAILED: on the CPU a record's answer must not depend on its batch"
        FAILED=1
      fi
    done
  fi
fi

stop_all
if [[ "$FAILED" == 1 ]]; then
  say "== FAILED (logs in $OUT)"
  exit 1
fi
say "== done"
