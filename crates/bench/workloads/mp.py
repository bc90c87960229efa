"""Python multiprocessing job for `farmem-bench compare --workload mp`.

Usage: mp.py --worker-bytes W [--workers N] [--passes P] [--seed S]

The parent imports numpy, then forks N workers (multiprocessing, 'fork' start method). Each
worker fills its own W-byte uint64 array with x[i] = i*A + B_w (B_w differs per worker, so a
page handed to the wrong process is caught), then makes P passes, each adding 1 to every
element and summing it chunk by chunk (one read-modify-write of every page per pass, so the
pages are dirty again each pass). The parent checks every worker's pass sums and the first word
of every page against values computed in closed form, and prints one JSON line with the phase
times; any mismatch is an error message and exit status 3.

Peak memory is about N * W + 26 MiB: measured as the memory cgroup's high-water mark (cgroup v1,
python3 3.11, numpy 1.24, Debian) at W = 4 MiB and 64 MiB, both 26 MiB above 4 * W. The parent
with numpy imported is ~33 MiB resident; the forked workers share most of it copy-on-write. The
harness does not use this figure: it measures the peak itself in the local run and takes the
--local fractions of that.
"""
import argparse
import json
import multiprocessing
import queue
import re
import sys
import time

import numpy as np

MASK = (1 << 64) - 1
A = 0x9E3779B97F4A7C15  # odd, so i*A mod 2^64 differs for every i
PAGE_WORDS = 4096 // 8
CHUNK_WORDS = (4 << 20) // 8  # 4 MiB: write and read of one chunk hit the same resident pages


def parse_bytes(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+)\s*(B|KiB|MiB|GiB|K|M|G)?\s*", text)
    if not m:
        raise argparse.ArgumentTypeError(f"bad size {text!r}: e.g. 4MiB or 268435456")
    unit = {None: 1, "B": 1, "K": 1 << 10, "KiB": 1 << 10, "M": 1 << 20, "MiB": 1 << 20,
            "G": 1 << 30, "GiB": 1 << 30}[m.group(2)]
    return int(m.group(1)) * unit


def offset(seed: int, w: int) -> int:
    return (seed * 0xD1B54A32D192ED03 + (w + 1) * 0xBF58476D1CE4E5B9) & MASK


def expected_sums(n: int, b: int, passes: int) -> list:
    # sum_i (i*A + b + p) for p = 1..passes, mod 2^64, with Python's exact integers.
    base = A * (n * (n - 1) // 2) + n * b
    return [(base + n * p) & MASK for p in range(1, passes + 1)]


def work(w: int, n: int, passes: int, seed: int, results) -> None:
    t0 = time.monotonic()
    x = np.arange(n, dtype=np.uint64)
    x *= np.uint64(A)  # wraps mod 2^64, as intended
    x += np.uint64(offset(seed, w))
    t1 = time.monotonic()
    sums = []
    one = np.uint64(1)
    for _ in range(passes):
        s = 0
        for start in range(0, n, CHUNK_WORDS):
            c = x[start:start + CHUNK_WORDS]
            c += one
            s += int(c.sum(dtype=np.uint64))
        sums.append(s & MASK)
    t2 = time.monotonic()
    # The first word of every page, where it should be: catches pages swapped or misplaced.
    idx = np.arange(0, n, PAGE_WORDS, dtype=np.uint64)
    want = idx * np.uint64(A) + np.uint64((offset(seed, w) + passes) & MASK)
    bad_pages = int(np.count_nonzero(x[::PAGE_WORDS] != want))
    results.put({"worker": w, "fill_s": t1 - t0, "passes_s": t2 - t1, "sums": sums,
                 "bad_pages": bad_pages})


def main() -> int:
    p = argparse.ArgumentParser(description="multiprocessing workload for farmem-bench compare")
    p.add_argument("--worker-bytes", type=parse_bytes, required=True)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--passes", type=int, default=3)
    p.add_argument("--seed", type=int, default=42)
    args = p.parse_args()
    n = args.worker_bytes // 8
    if n < PAGE_WORDS or args.workers < 1 or args.passes < 1:
        print("mp.py: need --worker-bytes >= 4096, --workers >= 1, --passes >= 1",
              file=sys.stderr)
        return 2
    ctx = multiprocessing.get_context("fork")
    results = ctx.Queue()
    t0 = time.monotonic()
    procs = [ctx.Process(target=work, args=(w, n, args.passes, args.seed, results))
             for w in range(args.workers)]
    for proc in procs:
        proc.start()
    # Drain the queue before joining (a worker blocks on exit until its result is read), and
    # stop waiting once a worker has died without one (killed, e.g. by the OOM killer).
    got = {}
    errors = []
    while len(got) < len(procs):
        try:
            r = results.get(timeout=1.0)
        except queue.Empty:
            if any(proc.exitcode not in (None, 0) for proc in procs):
                break
            continue
        got[r["worker"]] = r
    for w, proc in enumerate(procs):
        proc.join()
        if proc.exitcode != 0:
            errors.append(f"worker {w} exited with {proc.exitcode}")
    t1 = time.monotonic()
    for w in range(args.workers):
        r = got.get(w)
        if r is None:
            errors.append(f"worker {w} returned no result")
            continue
        want = expected_sums(n, offset(args.seed, w), args.passes)
        if r["sums"] != want:
            errors.append(f"worker {w} checksum mismatch: got {r['sums']}, expected {want}")
        if r["bad_pages"]:
            errors.append(f"worker {w}: {r['bad_pages']} pages hold the wrong data")
    ok = not errors
    print(json.dumps({
        "workers": args.workers, "worker_bytes": n * 8, "data_bytes": args.workers * n * 8,
        "passes": args.passes,
        "generate_s": max((r["fill_s"] for r in got.values()), default=float("nan")),
        "passes_s": max((r["passes_s"] for r in got.values()), default=float("nan")),
        "elapsed_s": t1 - t0, "checksum_ok": ok}))
    for e in errors:
        print(f"mp.py: {e}", file=sys.stderr)
    return 0 if ok else 3


if __name__ == "__main__":
    sys.exit(main())
