# Fills MiB of memory (argv[1]) page by page, then checks it twice: prints one checksum line.
# Its data is over any share of a small budget, so its pages must go far and come back.
import hashlib
import sys

n = int(sys.argv[1]) << 20
b = bytearray(n)
for i in range(0, n, 4096):
    b[i] = (i // 4096) % 251
h1 = hashlib.sha256(b).hexdigest()
h2 = hashlib.sha256(b).hexdigest()
print("ok" if h1 == h2 else "MISMATCH", h1[:16])
