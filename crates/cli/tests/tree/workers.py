# multiprocessing: 4 workers, each filling and checking its own MiB (argv[1]).
import hashlib
import multiprocessing as mp
import os
import sys
import threading


def start(barrier):
    global BARRIER
    BARRIER = barrier


def work(seed):
    # A pool hands tasks to whichever worker asks first, so a quick worker can take two and
    # leave another idle; the barrier holds each worker to one task, so all 4 do work.
    BARRIER.wait(timeout=120)
    n = int(sys.argv[1]) << 20
    b = bytearray(n)
    for i in range(0, n, 4096):
        b[i] = (i // 4096 + seed) % 251
    return hashlib.sha256(b).hexdigest()[:16]


def where(pid):
    # Where a worker that never reached the barrier is: each thread's kernel wait channel
    # and its /proc syscall line (the call and its arguments, then the stack pointer and the
    # program counter: a thread blocked in a page fault shows -1 and where it faulted, which
    # is how the fork-child hang in glibc's __ctype_init was found), read from /proc.
    out = []
    try:
        for tid in sorted(os.listdir(f"/proc/{pid}/task")):
            t = f"/proc/{pid}/task/{tid}"
            parts = []
            for f in ("wchan", "syscall"):
                try:
                    with open(f"{t}/{f}") as fh:
                        parts.append(fh.read().strip() or "-")
                except OSError as e:
                    parts.append(f"({e.strerror})")
            with open(f"{t}/comm") as fh:
                parts.insert(0, fh.read().strip())
            out.append(f"  thread {tid} {' '.join(parts)}")
    except OSError as e:
        out.append(f"  ({e})")
    return "\n".join(out)


if __name__ == "__main__":

    mp.set_start_method("fork")
    barrier = mp.Barrier(4)
    pool = mp.Pool(4, initializer=start, initargs=(barrier,))
    try:
        hashes = pool.map(work, range(4))
    except threading.BrokenBarrierError:
        print("a worker did not reach the barrier in 120 s; the workers:", file=sys.stderr)
        for p in mp.active_children():
            print(f"worker {p.pid}:\n{where(p.pid)}", file=sys.stderr)
        sys.exit(1)
    for h in hashes:
        print(h)
    # close + join lets the workers exit (and write their final stats); leaving a `with` block
    # would SIGTERM them, and a killed worker's stats stop at its last periodic write.
    pool.close()
    pool.join()
