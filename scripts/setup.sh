#!/usr/bin/env bash
# Installs what farmem's build, tests and benchmarks need on a fresh Debian machine, then builds
# farmem (release). Idempotent: a package already present is not fetched again.
set -euo pipefail
cd "$(dirname "$0")/.."

# Debian packages: the C compiler for test programs, and the real programs the tests and
# benchmarks run under farmem (/usr/bin/python3 with numpy and scikit-learn from Debian; node and
# a JDK for the managed-heap tests and the node-heap/jvm-heap benchmarks; Go for the cgo heap test;
# spin, the model checker the runtime's page-state model test runs: crates/runtime/tests/page_model.rs;
# stress-ng, whose verifying memory stressors `farmem-bench soak` runs; prometheus for promtool,
# which checks every metrics endpoint: crates/cli/tests/run_metrics.rs; tmux, the terminal
# `farmem top` is tested in: crates/cli/tests/top_cli.rs; systemd for systemd-analyze, strace, and
# python3-venv for kubernetes-validate's venv, which check deploy/: crates/cli/tests/deploy_files.rs;
# podman with runc (crun refuses this machine kind's hybrid cgroups): crates/cli/tests/container.rs;
# curl, which docs/operating.md uses: crates/cli/tests/operating_guide.rs).
PACKAGES=(build-essential pkg-config spin stress-ng prometheus tmux redis-server redis-tools memcached python3 python3-numpy python3-sklearn util-linux procps nodejs openjdk-17-jdk-headless golang-go systemd strace python3-venv podman runc curl)
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "setup: missing Debian packages: ${missing[*]} — run as root or install them with apt-get" >&2
    exit 1
  fi
  echo "setup: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  # The packaged servers start themselves; farmem's tests and benchmarks start their own.
  for svc in redis-server memcached prometheus; do
    if command -v systemctl >/dev/null 2>&1; then systemctl stop "$svc" >/dev/null 2>&1 || true; fi
    if command -v service >/dev/null 2>&1; then service "$svc" stop >/dev/null 2>&1 || true; fi
  done
fi

# Rust: the machine image ships rustup's toolchain; Debian's rustc is too old for the workspace.
if ! command -v cargo >/dev/null 2>&1; then
  for d in "$HOME/.cargo/bin" /root/.cargo/bin /usr/local/cargo/bin; do
    [ -x "$d/cargo" ] && export PATH="$d:$PATH" && break
  done
fi
command -v cargo >/dev/null 2>&1 || {
  echo "setup: cargo not found: install Rust ≥ 1.80 (rustup) and re-run" >&2
  exit 1
}

# kubernetes-validate, pinned, in a project-local venv made by Debian's python3 (whose venv module
# is python3-venv): crates/cli/tests/deploy_files.rs validates deploy/kubernetes/ with it.
KUBERNETES_VALIDATE_VERSION=1.37.0
TOOLS_VENV=target/tools/venv
if [ "$("$TOOLS_VENV/bin/kubernetes-validate" --version 2>/dev/null)" != "$KUBERNETES_VALIDATE_VERSION" ]; then
  echo "setup: installing kubernetes-validate $KUBERNETES_VALIDATE_VERSION into $TOOLS_VENV" >&2
  /usr/bin/python3 -m venv --clear "$TOOLS_VENV"
  "$TOOLS_VENV/bin/pip" install -q "kubernetes-validate==$KUBERNETES_VALIDATE_VERSION" || {
    echo "setup: installing kubernetes-validate $KUBERNETES_VALIDATE_VERSION from PyPI failed" >&2
    exit 1
  }
fi

cargo build --release --workspace --locked 2>&1 | grep -Ev '^\s+(Compiling|Downloaded|Downloading)' >&2 || {
  echo "setup: cargo build failed" >&2
  exit 1
}
