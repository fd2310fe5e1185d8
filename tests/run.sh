#!/usr/bin/env bash
# The test command. On a fresh machine with Rust and python3 it installs what
# the tests need (nats-server, the real model, an S3-compatible server) into
# .tools/, then checks formatting, lints and runs every test.
set -euo pipefail
cd "$(dirname "$0")/.."
source deploy/tools.sh --test
cargo fmt --all --check
cargo clippy --workspace --all-targets -- -D warnings
# Integration tests drive the real binaries: build them first (cargo test
# builds only the binaries of packages that have integration tests).
cargo build --workspace --bins
cargo test --workspace
bash tests/python/run.sh
