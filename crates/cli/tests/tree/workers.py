# multiprocessing: 4 workers, each filling and checking its own MiB (argv[1]).
import hashlib
import multiprocessing as mp
import sys


def work(seed):
    n = int(sys.argv[1]) << 20
    b = bytearray(n)
    for i in range(0, n, 4096):
        b[i] = (i // 4096 + seed) % 251
    return hashlib.sha256(b).hexdigest()[:16]


if __name__ == "__main__":
    mp.set_start_method("fork")
    with mp.Pool(4) as pool:
        for h in pool.map(work, range(4)):
            print(h)
