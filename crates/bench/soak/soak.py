# The soak's Python program (farmem-bench soak): a heap of small objects rewritten in a seeded
# random order, each checked on every visit; prints a digest that depends only on the
# arguments, so the harness compares it with a run without farmem.
import hashlib
import random
import sys

n, rounds = int(sys.argv[1]), int(sys.argv[2])
heap = [[i, str(i) * 4, 0] for i in range(n)]
rnd = random.Random(7)
for _ in range(rounds * n):
    o = heap[rnd.randrange(n)]
    if o[1] != str(o[0]) * 4:
        print(f"FAIL python: object {o[0]} holds {o[1]!r}")
        sys.exit(1)
    o[2] += 1
h = hashlib.sha256()
for i, s, v in heap:
    h.update(f"{i}:{s}:{v};".encode())
print(f"ok python {n} {h.hexdigest()}")
