#!/usr/bin/env bash
# Port-race stress run: the integration test binaries that start the most
# servers, run ROUNDS times in a row (default 5) with a CPU-heavy process
# beside them (one busy loop per core), each round a single `cargo test` over
# all of them; prints every round's counts and a total. Servers in the tests
# bind ports of their own choosing, so this must end with 0 failed.
#
#   bash tests/bench/port_stress.sh [--rounds N] [--hogs N] [--count] [--tests a,b,...]
#
# --hogs: busy loops beside the tests (default 1, a whole core of this
# 2-core machine; one per core starves timing-bound tests, which is not what
# this measures).
# --count first runs every integration test binary once with nats-server,
# moto, PostgreSQL and chromedriver wrapped to count the servers each binary
# starts (`minions dev`'s servers count for the test that ran it), and prints
# the table; the default list below came from it.
set -euo pipefail
cd "$(dirname "$0")/../.."
root="$(pwd)"

rounds=5
hogs_n=1
count=0
tests="cluster,llm_fleet,dev_fleet,leaf,ledger,nats_restart,roles,trust,owner,admin"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --rounds) rounds="$2"; shift 2 ;;
    --hogs) hogs_n="$2"; shift 2 ;;
    --count) count=1; shift ;;
    --tests) tests="$2"; shift 2 ;;
    -h|--help) sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "port_stress: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done

source deploy/tools.sh --test
cargo build --workspace --bins --quiet
cargo test -p minions-tests --no-run --quiet 2>/dev/null

work="$(mktemp -d)"
chmod 755 "$work"
hogs=()
cleanup() {
  for h in "${hogs[@]}"; do kill "$h" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

if [[ "$count" == 1 ]]; then
  # Each wrapper notes the test binary above it, then becomes the server
  # (exec keeps the pid, which nats-server's ports file is named after).
  log="$work/starts.log"
  : >"$log"
  chmod 666 "$log"
  wrap() { # NAME REAL OUT
    cat >"$3" <<EOF
#!/usr/bin/env bash
p=\$PPID
while [[ -r /proc/\$p/cmdline ]]; do
  exe="\$(tr '\\0' '\\n' </proc/\$p/cmdline | head -n 1)"
  case "\$(basename "\$exe")" in minions|bash|sh|env) p="\$(awk '/^PPid:/ {print \$2}' /proc/\$p/status)" ;; *) break ;; esac
done
echo "\$(basename "\$exe" | sed 's/-[0-9a-f]\{16\}\$//') $1" >>"$log"
exec "$2" "\$@"
EOF
    chmod 755 "$3"
  }
  status=0
  mkdir -p "$work/bin" "$work/pg"
  wrap nats-server "$NATS_SERVER_BIN" "$work/bin/nats-server"
  wrap moto "$MINIONS_MOTO_BIN" "$work/bin/moto_server"
  wrap chromedriver "$CHROMEDRIVER_BIN" "$work/bin/chromedriver"
  for f in "$MINIONS_PG_BIN"/*; do ln -s "$f" "$work/pg/$(basename "$f")"; done
  rm "$work/pg/postgres"
  wrap postgres "$MINIONS_PG_BIN/postgres" "$work/pg/postgres"
  NATS_SERVER_BIN="$work/bin/nats-server" MINIONS_MOTO_BIN="$work/bin/moto_server" \
    CHROMEDRIVER_BIN="$work/bin/chromedriver" MINIONS_PG_BIN="$work/pg" \
    cargo test -p minions-tests --tests --no-fail-fast >"$work/count.log" 2>&1 || status=$?
  echo "servers started per test binary (one run):"
  awk '{n[$1]++} END {for (b in n) print n[b], b}' "$log" | sort -rn
  python3 tests/summary.py --cargo "$work/count.log" --cargo-status "$status" || true
fi

for _ in $(seq 1 "$hogs_n"); do
  python3 -c 'while True: pass' &
  hogs+=("$!")
done
echo "port_stress: $rounds rounds of [$tests], beside $hogs_n busy loop(s)" >&2
args=()
IFS=, read -r -a names <<<"$tests"
for t in "${names[@]}"; do args+=(--test "$t"); done
passed=0
failed=0
for r in $(seq 1 "$rounds"); do
  start=$SECONDS
  status=0
  cargo test -p minions-tests --no-fail-fast "${args[@]}" >"$work/round$r.log" 2>&1 || status=$?
  report="$(python3 tests/summary.py --cargo "$work/round$r.log" --cargo-status "$status" || true)"
  line="$(tail -n 1 <<<"$report")"
  echo "round $r ($((SECONDS - start)) s): $line"
  sed -n '/^failed:/,/^summary:/p' <<<"$report" | sed '$d'
  if [[ "$status" != 0 ]]; then
    cp "$work/round$r.log" "target/port-stress-round$r.log"
    echo "  (log kept: target/port-stress-round$r.log)"
  fi
  p="$(sed -n 's/.*\b\([0-9][0-9]*\) passed.*/\1/p' <<<"$line")"
  f="$(sed -n 's/.*\b\([0-9][0-9]*\) failed.*/\1/p' <<<"$line")"
  passed=$((passed + ${p:-0}))
  failed=$((failed + ${f:-1}))
done
echo "port_stress: $passed passed, $failed failed"
[[ "$failed" == 0 ]]
