#!/usr/bin/env bash
# The test command. On a fresh machine with Rust and python3 it installs what
# the tests need (nats-server, the real model, an S3-compatible server) into
# .tools/, then checks formatting, lints and runs every test.
# A formatting, lint or build failure stops it at once. Past those, every Rust
# test and the Python tests run even when some fail: the Rust tests under
# cargo-nextest where it is installed (tests of all binaries side by side,
# settings in .config/nextest.toml), else under cargo test. The run ends with
# one summary (tests/summary.py, from nextest's JUnit report and the logs kept
# in target/test-logs/): the ten slowest tests, every failed test, and as the
# last line `summary: N passed, N failed, N skipped`. It exits non-zero when
# anything failed.
set -euo pipefail
cd "$(dirname "$0")/.."
# How long each step took, printed above the summary (CI's time is budgeted).
steps=()
step_start=$SECONDS
step() {
  steps+=("$1 $((SECONDS - step_start)) s")
  step_start=$SECONDS
}
source deploy/tools.sh --test
step tools
cargo fmt --all --check
step fmt
# The CUDA build (`--features cuda`) never rots: the lints run on it, so
# every crate compiles with candle's CUDA backend and candle's CUDA kernels
# compile with nvcc from PyPI's CUDA 13.0 wheels (tests/gpu/cuda_tools.sh),
# unoptimised (-O0: these kernels are never run here; it takes half the
# time); then the worker is built and linked with it, against stubs of the
# CUDA libraries it names (no CUDA library is installed), and loaded with
# every symbol bound to show that the executable is whole. The code a build
# without the feature compiles is the same code (the feature only changes
# `cfg!` values). The build without CUDA runs after it, so the binaries the
# tests run are the plain ones. Where nvcc has no wheel (macOS, Windows),
# the lints run without CUDA and nothing is linked for it.
clippy_features=()
if [[ "$(uname -s)" == Linux && "$(uname -m)" =~ ^(x86_64|aarch64)$ ]]; then
  source tests/gpu/cuda_tools.sh
  export NVCC_APPEND_FLAGS="-Xcicc -O0 -Xptxas -O0"
  # candle's kernel build runs nvcc on half the cores unless told.
  export CUDAFORGE_THREADS="$(nproc)"
  clippy_features=(--features minions-worker/cuda)
  step "cuda compiler"
fi
cargo clippy --workspace --all-targets ${clippy_features[@]+"${clippy_features[@]}"} -- -D warnings
step "clippy (with --features cuda on Linux)"
if [[ ${#clippy_features[@]} -gt 0 ]]; then
  # The same packages as the build below, so that only the crates the
  # feature changes are built twice.
  cargo build --workspace --exclude minions-bench --features minions-worker/cuda \
    --bin minions-worker
  bash tests/gpu/loads.sh "${CARGO_TARGET_DIR:-target}/debug/minions-worker"
  step "cuda build (the worker, linked)"
fi
unset NVCC_APPEND_FLAGS CUDAFORGE_THREADS
# Integration tests drive the real binaries: build them first (cargo test
# builds only the binaries of packages that have integration tests), in
# one go with the tests themselves, so that neither build waits alone on
# its last link. The benchmarks (package minions-bench) are left out of
# the build and the tests: no test runs them, and clippy has checked them
# above.
cargo build --workspace --exclude minions-bench --bins --tests
step "build (binaries and tests)"

target="${CARGO_TARGET_DIR:-target}"
logs="$target/test-logs"
mkdir -p "$logs"
set +e
if cargo nextest --version >/dev/null 2>&1; then
  # cargo-nextest (.config/nextest.toml): every test in a process of its
  # own, tests of all binaries side by side; its JUnit report feeds the
  # summary. It does not run doc tests: cargo test does, after it.
  junit="$target/nextest/default/junit.xml"
  rm -f "$junit"
  cargo nextest run --workspace --exclude minions-bench --no-fail-fast 2>&1 | tee "$logs/nextest.log"
  nextest_status=${PIPESTATUS[0]}
  step "rust tests (nextest)"
  cargo test --workspace --exclude minions-bench --doc 2>&1 | tee "$logs/doc-tests.log"
  doc_status=${PIPESTATUS[0]}
  step "doc tests"
  rust=(--junit "$junit" --junit-status "$nextest_status"
    --cargo "$logs/doc-tests.log" --cargo-status "$doc_status")
else
  echo "tests: cargo-nextest not found (cargo install cargo-nextest); running cargo test" >&2
  cargo test --workspace --exclude minions-bench --no-fail-fast 2>&1 | tee "$logs/cargo-test.log"
  cargo_status=${PIPESTATUS[0]}
  step "rust tests (cargo test)"
  rust=(--cargo "$logs/cargo-test.log" --cargo-status "$cargo_status")
fi
bash tests/python/run.sh 2>&1 | tee "$logs/python-tests.log"
python_status=${PIPESTATUS[0]}
step "python tests (with the client's build)"
set -e
echo
echo "time per step:"
printf '  %s\n' "${steps[@]}"
python3 tests/summary.py "${rust[@]}" \
  --pytest "$logs/python-tests.log" --pytest-status "$python_status"
