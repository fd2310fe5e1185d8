# Sourced by the benchmark scripts.
#
# bench_venv IMPORTS REQS...: sets `py` to a Python that can import IMPORTS
# (a comma-separated module list), installing the pip requirements REQS
# into .tools/bench-venv once when needed. BENCH_PYTHON=/path/to/python
# uses an interpreter that has them already.
#
# bench_venv_in DIR IMPORTS REQS...: the same in the venv DIR, without the
# override (for references whose pins clash with the main venv's).
bench_venv() {
  py="${BENCH_PYTHON:-}"
  if [[ -n "$py" ]]; then return; fi
  bench_venv_in .tools/bench-venv "$@"
}

bench_venv_in() {
  local venv="$1" imports="$2"; shift 2
  if [[ ! -x "$venv/bin/python" ]]; then
    echo "bench: creating $venv for $imports (PyTorch is large; minutes)" >&2
    "${PYTHON:-python3}" -m venv "$venv"
  fi
  if ! "$venv/bin/python" -c "import $imports" 2>/dev/null; then
    "$venv/bin/python" -m pip --disable-pip-version-check -q install "$@"
  fi
  py="$venv/bin/python"
}
