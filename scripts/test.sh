#!/usr/bin/env bash
# The test command: sets up a fresh machine (scripts/setup.sh), then runs every test of the
# workspace in release mode — real userfaultfd, real donor processes over loopback, real programs.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
[ -e /dev/userfaultfd ] || [ "$(id -u)" -eq 0 ] || {
  echo "test: userfaultfd is not available to this user: grant access to /dev/userfaultfd or run as root" >&2
  exit 1
}
cargo fmt --all --check
cargo clippy --release --workspace --all-targets --locked -- -D warnings
cargo test --release --workspace --locked --no-fail-fast -- --test-threads=2
