# multiprocessing: 4 workers, each filling and checking its own MiB (argv[1]).
import hashlib
import multiprocessing as mp
import sys


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


if __name__ == "__main__":
    mp.set_start_method("fork")
    barrier = mp.Barrier(4)
    pool = mp.Pool(4, initializer=start, initargs=(barrier,))
    for h in pool.map(work, range(4)):
        print(h)
    # close + join lets the workers exit (and write their final stats); leaving a `with` block
    # would SIGTERM them, and a killed worker's stats stop at its last periodic write.
    pool.close()
    pool.join()
