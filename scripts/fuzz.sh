#!/usr/bin/env bash
# Runs the cargo-fuzz targets under fuzz/ (nightly Rust and cargo-fuzz: `cargo install
# cargo-fuzz`). Each run starts from, and adds to, the target's corpus fuzz/corpus/TARGET/
# (seeded from real frames, traces and configuration by `scripts/fuzz.sh seeds`); the normal
# test suite replays every corpus file on stable Rust.
#
#   scripts/fuzz.sh TARGET SECONDS   fuzz one target (decode, donor, trace, config, node_wire)
#   scripts/fuzz.sh all SECONDS      fuzz each target for SECONDS, one after the other
#   scripts/fuzz.sh seeds            rewrite the seed files of every corpus
#
# One process per target, in the foreground (no -jobs/-workers: their worker writes fuzz-N.log
# in this folder, and two targets run at once would share one): the machine is shared.
# libFuzzer's last status line (#runs, cov, ft, corp, exec/s) and its final counters are printed
# per target; a crash stops with its input under fuzz/artifacts/.
#
# Sanitizer: AddressSanitizer for decode, trace and config; none for donor, whose unsafe code
# touches only slab memory, which is mmap'd and which ASan does not watch (syscalls and atomic
# page copies), while ASan costs that target two thirds of its executions (each input is a
# whole session of up to hundreds of requests; see docs/architecture.md). FUZZ_SANITIZER=address
# (or none) sets it for every target; each sanitizer builds into a folder of its own under
# fuzz/target/, so switching does not rebuild. What makes the ASan runs faster without checking
# less:
# - libFuzzer's own C++ is compiled without ASan (cc, which builds libfuzzer-sys, otherwise
#   copies rustc's -Zsanitizer=address onto it, and libFuzzer's per-input coverage bookkeeping
#   then runs instrumented: a third of the config target's time);
# - anyhow captures no backtrace for each error of a refused input (RUST_BACKTRACE=1 in the
#   environment would make it); panics keep theirs;
# - ASan keeps no fake stacks for use-after-return (safe Rust cannot return a dangling reference
#   to a stack frame, and the donor's unsafe code hands none out), a 16 MiB quarantine of freed
#   memory instead of 256 MiB (an input frees far less; the process stays near 90 MB instead of
#   450 MB and its allocations warm in the cache), and no allocation stack per malloc (a crash
#   report still shows where the bad access happened; `cargo +nightly fuzz run TARGET INPUT`
#   reruns the input with ASan's defaults, which add the allocation and free stacks).
# Each default gives way to the variable set in the environment. FUZZ_LOG_DIR=DIR keeps each
# target's whole libFuzzer log as DIR/TARGET.log.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"

# The sanitizer target $1 is built with.
sanitizer() {
    if [ -n "${FUZZ_SANITIZER:-}" ]; then
        echo "$FUZZ_SANITIZER"
    elif [ "$1" = donor ]; then
        echo none
    else
        echo address
    fi
}
export CXXFLAGS="${CXXFLAGS:+$CXXFLAGS }-fno-sanitize=address"
export RUST_LIB_BACKTRACE=${RUST_LIB_BACKTRACE:-0}
export ASAN_OPTIONS=${ASAN_OPTIONS-detect_stack_use_after_return=0:quarantine_size_mb=16:malloc_context_size=0}

TARGETS=(decode donor trace config node_wire)

usage() {
    echo "usage: $0 {${TARGETS[*]// /|}|all} SECONDS | $0 seeds" >&2
    exit 2
}

run_one() {
    local target=$1 secs=$2 log san dir=()
    log=$(mktemp)
    mkdir -p "corpus/$target"
    san=$(sanitizer "$target")
    if [ "$san" != address ]; then
        dir=(--target-dir "target/$san")
    fi
    echo "== fuzzing $target for ${secs}s (sanitizer: $san)"
    # Each donor input is a whole session (in-process, no socket): a hang is a bug.
    local extra=()
    if [ "$target" = donor ]; then
        extra=(-timeout=10)
    fi
    if ! cargo +nightly fuzz run -s "$san" "${dir[@]}" "$target" "corpus/$target" -- \
        -max_total_time="$secs" -print_final_stats=1 "${extra[@]}" \
        >"$log" 2>&1; then
        tail -n 40 "$log"
        echo "fuzz target $target failed (see the crash input under fuzz/artifacts/$target/)" >&2
        rm -f "$log"
        return 1
    fi
    grep -E '^#[0-9]+' "$log" | tail -n 1
    grep -E '^stat::' "$log" || true
    if [ -n "${FUZZ_LOG_DIR:-}" ]; then
        cp "$log" "$FUZZ_LOG_DIR/$target.log"
    fi
    rm -f "$log"
}

[ $# -ge 1 ] || usage
case $1 in
seeds)
    cargo +nightly run --release --bin seeds
    ;;
all)
    [ $# -eq 2 ] || usage
    for t in "${TARGETS[@]}"; do run_one "$t" "$2"; done
    ;;
*)
    [ $# -eq 2 ] || usage
    [[ " ${TARGETS[*]} " == *" $1 "* ]] || usage
    run_one "$1" "$2"
    ;;
esac
