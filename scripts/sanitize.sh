#!/usr/bin/env bash
# Runs the runtime's tests (unit and integration: real userfaultfd, real donors and nodes) and
# the preload library's unit tests under a sanitizer (nightly Rust, with the
# standard library rebuilt instrumented: -Zbuild-std, which needs the rust-src component; the
# script adds it).
#
#   scripts/sanitize.sh address   AddressSanitizer: out-of-bounds, use-after-free, leaks
#   scripts/sanitize.sh thread    ThreadSanitizer: data races
#   scripts/sanitize.sh all       both, one after the other
#
# Each sanitizer builds into a folder of its own (target/sanitize-NAME/), so switching does not
# rebuild. The farmem binary and the preload library the integration tests start are built there
# too, with the same sanitizer: a program under test runs instrumented end to end. The exit
# status is non-zero when a test fails or a sanitizer reports (a report fails its test).
#
# Options, each giving way to the variable set in the environment:
# - ASAN_OPTIONS handle_sigbus=0 and TSAN_OPTIONS handle_sigbus=0: a page that can no longer be
#   served ends the program with SIGBUS, and tests check that it does; the sanitizer's own
#   handler would turn it into a report and exit status 1.
# - TSAN_OPTIONS halt_on_error=0, report_signal_unsafe=0: every race is printed, not just the
#   first; the fault thread's SIGBUS delivery is not a signal handler's doing.
#   suppressions=scripts/tsan-suppressions.txt: the reports that are no bug, each with why.
#
# Not under a sanitizer: the cli's end-to-end tests, which load the preload library into real
# programs (Python, a JVM, redis) not built with one (an instrumented library needs the
# sanitizer's runtime loaded first in the program), and the bench harness.
set -euo pipefail
cd "$(dirname "$0")/.."

TARGET=x86_64-unknown-linux-gnu
PACKAGES=(-p farmem-runtime -p farmem-preload)

usage() {
    echo "usage: scripts/sanitize.sh address|thread|all" >&2
    exit 2
}

[ $# -eq 1 ] || usage
case "$1" in
address | thread) which=("$1") ;;
all) which=(address thread) ;;
*) usage ;;
esac

if ! rustup component list --toolchain nightly --installed 2>/dev/null | grep -q '^rust-src'; then
    rustup component add rust-src --toolchain nightly
fi

run() {
    local san=$1
    export RUSTFLAGS="-Zsanitizer=$san"
    export RUSTDOCFLAGS="-Zsanitizer=$san"
    export CARGO_TARGET_DIR="target/sanitize-$san"
    export ASAN_OPTIONS="${ASAN_OPTIONS:-handle_sigbus=0:detect_leaks=1}"
    export TSAN_OPTIONS="${TSAN_OPTIONS:-handle_sigbus=0:halt_on_error=0:report_signal_unsafe=0:suppressions=$PWD/scripts/tsan-suppressions.txt}"
    local flags=(-Zbuild-std --target "$TARGET")
    local failed=0
    echo "== $san: building farmem and the preload library"
    # The binaries the integration tests start (testkit::bins looks next to the test executables).
    cargo +nightly build "${flags[@]}" -p farmem -p farmem-preload || return 1
    echo "== $san: the runtime's tests"
    cargo +nightly test "${flags[@]}" -p farmem-runtime --lib --tests --no-fail-fast \
        -- --test-threads=2 || failed=1
    echo "== $san: the preload library's unit tests"
    cargo +nightly test "${flags[@]}" -p farmem-preload --lib --no-fail-fast \
        -- --test-threads=2 || failed=1
    return $failed
}

status=0
for san in "${which[@]}"; do
    run "$san" || status=1
done
exit $status
