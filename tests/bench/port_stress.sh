#!/usr/bin/env bash
# Port-race stress run: the integration test areas (modules of the one
# integration binary, tests/tests/main.rs) that start the most servers, run
# ROUNDS times in a row (default 5) with a CPU-heavy process
# beside them (one busy loop per core), each round a single `cargo test` over
# all of them; prints every round's counts and a total. Servers in the tests
# bind ports of their own choosing, so this must end with 0 failed.
#
#   bash tests/bench/port_stress.sh [--rounds N] [--hogs N] [--count] [--tests a,b/c,...]
#
# --tests: lanes separated by `/`, each a comma-separated list of test
# areas; lanes run side by side (more servers at once), each lane's areas
# one after another. The default puts the longest area alone beside the nine
# others.
# --hogs: busy loops beside the tests (default 1, a whole core of this
# 2-core machine; one per core starves timing-bound tests, which is not what
# this measures).
# --count first runs every integration test area once with nats-server,
# moto, PostgreSQL and chromedriver wrapped to count the servers each area
# starts (`minions dev`'s servers count for the test that ran it), and prints
# the table; the default list below came from it (the ten that start the
# most: cluster 17, roles 8, deploy_configs 6, tls 5, owner, llm_fleet, leaf
# and dev_fleet 4, trust and ledger 3).
set -euo pipefail
cd "$(dirname "$0")/../.."
root="$(pwd)"

rounds=5
hogs_n=1
count=0
tests="llm_fleet/cluster,roles,deploy_configs,tls,owner,leaf,dev_fleet,trust,ledger"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --rounds) rounds="$2"; shift 2 ;;
    --hogs) hogs_n="$2"; shift 2 ;;
    --count) count=1; shift ;;
    --tests) tests="$2"; shift 2 ;;
    -h|--help) sed -n '2,23p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "port_stress: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done

source deploy/tools.sh --test
cargo build --workspace --exclude minions-bench --bins --quiet
cargo test -p minions-tests --no-run --quiet 2>/dev/null
# The one integration binary, newest build.
exe="$(ls -t target/debug/deps/integration-???????????????? | head -n 1)"
areas="$(sed -n 's/^mod \([a-z_0-9]*\);$/\1/p' tests/tests/main.rs)"

work="$(mktemp -d)"
chmod 755 "$work"
hogs=()
cleanup() {
  for h in "${hogs[@]}"; do kill "$h" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

if [[ "$count" == 1 ]]; then
  # Each wrapper notes the area that started it (the environment the loop
  # below sets reaches the servers through the test and the binaries), then
  # becomes the server (exec keeps the pid, which nats-server's ports file is
  # named after).
  log="$work/starts.log"
  : >"$log"
  chmod 666 "$log"
  wrap() { # NAME REAL OUT
    cat >"$3" <<EOF
#!/usr/bin/env bash
echo "\${MINIONS_STRESS_AREA:-unknown} $1" >>"$log"
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
  : >"$work/count.log"
  for area in $areas; do
    echo "     Running tests/tests/main.rs ($exe)" >>"$work/count.log"
    (cd tests && MINIONS_STRESS_AREA="$area" NATS_SERVER_BIN="$work/bin/nats-server" \
      MINIONS_MOTO_BIN="$work/bin/moto_server" CHROMEDRIVER_BIN="$work/bin/chromedriver" \
      MINIONS_PG_BIN="$work/pg" "../$exe" "$area::") >>"$work/count.log" 2>&1 || status=1
  done
  echo "servers started per test area (one run):"
  awk '{n[$1]++} END {for (b in n) print n[b], b}' "$log" | sort -rn
  python3 tests/summary.py --cargo "$work/count.log" --cargo-status "$status" || true
fi

for _ in $(seq 1 "$hogs_n"); do
  python3 -c 'while True: pass' &
  hogs+=("$!")
done
echo "port_stress: $rounds rounds of [$tests], beside $hogs_n busy loop(s)" >&2
# Lanes ("a,b/c,d") run side by side, each its areas one after another,
# straight from target/ (two `cargo test` would wait on each other's lock).
lane() { # LOG AREA...
  local out="$1" name status=0
  shift
  for name in "$@"; do
    echo "     Running tests/tests/main.rs ($exe)" >>"$out"
    (cd tests && "../$exe" "$name::") >>"$out" 2>&1 || {
      local rc=$?
      echo "error: test failed, to rerun pass \`-p minions-tests --test integration $name::\`" >>"$out"
      echo "process didn't exit successfully: \`$exe\` (exit status: $rc)" >>"$out"
      status=1
    }
  done
  return "$status"
}
passed=0
failed=0
for r in $(seq 1 "$rounds"); do
  start=$SECONDS
  status=0
  : >"$work/round$r.log"
  pids=()
  IFS=/ read -r -a lanes <<<"$tests"
  for i in "${!lanes[@]}"; do
    IFS=, read -r -a names <<<"${lanes[$i]}"
    lane "$work/round$r.lane$i.log" "${names[@]}" &
    pids+=("$!")
  done
  for p in "${pids[@]}"; do wait "$p" || status=1; done
  cat "$work"/round$r.lane*.log >"$work/round$r.log"
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
