#!/usr/bin/env bash
# The test command. On a fresh machine with Rust and python3 it installs what
# the tests need (nats-server, the real model, an S3-compatible server) into
# .tools/, then checks formatting, lints and runs every test.
# A formatting, lint or build failure stops it at once. Past those, every Rust
# test binary and the Python tests run even when some fail, and the run ends
# with one summary (tests/summary.py, from the logs kept in target/test-logs/):
# the slowest test binaries, every failed test, and as the last line
# `summary: N passed, N failed, N skipped`. It exits non-zero when anything failed.
set -euo pipefail
cd "$(dirname "$0")/.."
source deploy/tools.sh --test
cargo fmt --all --check
cargo clippy --workspace --all-targets -- -D warnings
# Integration tests drive the real binaries: build them first (cargo test
# builds only the binaries of packages that have integration tests).
cargo build --workspace --bins

logs="${CARGO_TARGET_DIR:-target}/test-logs"
mkdir -p "$logs"
set +e
cargo test --workspace --no-fail-fast 2>&1 | tee "$logs/cargo-test.log"
cargo_status=${PIPESTATUS[0]}
bash tests/python/run.sh 2>&1 | tee "$logs/python-tests.log"
python_status=${PIPESTATUS[0]}
set -e
python3 tests/summary.py \
  --cargo "$logs/cargo-test.log" --cargo-status "$cargo_status" \
  --pytest "$logs/python-tests.log" --pytest-status "$python_status"
