#!/usr/bin/env bash
# The Python tests: a virtual environment at .tools/py-venv (installed from
# tests/python/requirements.txt, again only when that file changes), the
# Python client built into it when python/pyproject.toml exists, then pytest
# over tests/python against a local fleet of the workspace's debug binaries
# (MINIONS_BIN_DIR picks others). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/../.."
root="$(pwd)"
venv="$root/.tools/py-venv"
req="$root/tests/python/requirements.txt"

if [[ ! -x "$venv/bin/python" ]]; then
  echo "python tests: creating .tools/py-venv" >&2
  "${PYTHON:-python3}" -m venv "$venv"
fi
hash_of() { "$venv/bin/python" -c 'import hashlib, sys; print(hashlib.sha256(open(sys.argv[1], "rb").read()).hexdigest())' "$1"; }
stamp="$venv/.requirements.sha256"
want="$(hash_of "$req")"
if [[ "$(cat "$stamp" 2>/dev/null || true)" != "$want" ]]; then
  echo "python tests: installing tests/python/requirements.txt" >&2
  "$venv/bin/python" -m pip install --disable-pip-version-check -q -r "$req"
  echo "$want" >"$stamp"
fi

# nats-server, the test model and the S3-compatible server, as tests/run.sh
# has them (it has sourced this already).
if [[ -z "${NATS_SERVER_BIN:-}" || -z "${MINIONS_TEST_MODEL_DIR:-}" || -z "${MINIONS_MOTO_BIN:-}" ]]; then
  source deploy/tools.sh --test
fi

if [[ -f python/pyproject.toml ]]; then
  # Into the venv, with the workspace's target dir so its debug builds are reused.
  # Its chatter is shown only when it fails.
  if ! log="$(cd python && VIRTUAL_ENV="$venv" CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/target}" \
    "$venv/bin/maturin" develop --quiet 2>&1)"; then
    echo "$log" >&2
    echo "python tests: maturin develop failed for python/" >&2
    exit 1
  fi
fi

export PYTHONDONTWRITEBYTECODE=1
# -rfE: a FAILED or ERROR line with the node id of each failure, which
# tests/summary.py lists.
exec "$venv/bin/python" -m pytest -q -rfE -p no:cacheprovider tests/python "$@"
