# Sourced by the benchmark scripts: sets `py` to a Python that can import
# $1 (a comma-separated module list), installing the pip requirements
# $2... into .tools/bench-venv once when needed. BENCH_PYTHON=/path/to/python
# uses an interpreter that has them already.
bench_venv() {
  local imports="$1"; shift
  py="${BENCH_PYTHON:-}"
  if [[ -n "$py" ]]; then return; fi
  local venv=.tools/bench-venv
  if [[ ! -x "$venv/bin/python" ]]; then
    echo "bench: creating $venv for $imports (PyTorch is large; minutes)" >&2
    "${PYTHON:-python3}" -m venv "$venv"
  fi
  if ! "$venv/bin/python" -c "import $imports" 2>/dev/null; then
    "$venv/bin/python" -m pip --disable-pip-version-check -q install "$@"
  fi
  py="$venv/bin/python"
}
