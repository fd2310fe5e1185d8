#!/usr/bin/env bash
# How many greedy answers survive a change of arithmetic that is not a bug:
# llama.cpp against itself, its flash-attention kernel on and off
# (`llama-server -fa on|off`), over the 200 chat prompts of the GPU script
# (tests/gpu/run.sh: greedy, up to 64 tokens each), and the plain path run
# twice. The yardstick for the device path's greedy figure (tests/gpu/run.sh
# with MINIONS_ENGINE_PATH=device): equal answers need equal bits, not close
# ones, since every near tie on the way sends an answer elsewhere.
#
#   bash tests/bench/attention_paths.sh     # builds llama.cpp (deploy/llama_cpp.sh)
set -euo pipefail
cd "$(dirname "$0")/../.."
source deploy/tools.sh --test
bin="$(bash deploy/llama_cpp.sh | tail -1)"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
python3 tests/gpu/report.py prompts 200 tests/fixtures/smollm2/greedy.json "$out/prompts.jsonl"
python3 - "$bin/llama-server" "$MINIONS_TEST_GGUF" "$out" <<'PY'
import concurrent.futures as cf
import json, socket, subprocess, sys, time, urllib.request

server, gguf, out = sys.argv[1:4]
prompts = [json.loads(line) for line in open(f"{out}/prompts.jsonl")]


def answers(fa):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    srv = subprocess.Popen([server, "-m", gguf, "-fa", fa, "--parallel", "16", "-c", "16384",
                            "--port", str(port), "-t", "2", "--no-warmup"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(600):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health").read()
                break
            except OSError:
                time.sleep(0.2)

        def ask(p):
            body = json.dumps({"messages": p["messages"], "temperature": 0, "top_k": 1,
                               "max_tokens": 64, "cache_prompt": False}).encode()
            req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", body,
                                         {"Content-Type": "application/json"})
            reply = json.loads(urllib.request.urlopen(req).read())
            return p["id"], reply["choices"][0]["message"]["content"]

        with cf.ThreadPoolExecutor(16) as ex:
            return dict(ex.map(ask, prompts))
    finally:
        srv.kill()


off, on, again = answers("off"), answers("on"), answers("off")
same = lambda a, b: sum(a[k] == b[k] for k in a)
print(f"llama.cpp, {len(prompts)} chat prompts, greedy, up to 64 tokens, 16 slots:")
print(f"  flash attention on against off: {same(off, on)} of {len(prompts)} answers equal")
print(f"  off against off, run again:     {same(off, again)} of {len(prompts)} answers equal")
PY
