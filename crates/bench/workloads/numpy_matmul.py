"""numpy matrix multiplication for `farmem-bench compare --workload numpy`.

Usage: numpy_matmul.py N [SEED]

Multiplies two random N x N float64 matrices (C = A @ B), so the three operands take
3 * N * N * 8 bytes. Prints one JSON line: the phase times and a checksum of C compared with
an independent computation of a few entries, so a paging system that corrupts pages fails
(exit status 3).
"""
import json
import sys
import time

import numpy as np


def main() -> int:
    if len(sys.argv) < 2:
        print("usage: numpy_matmul.py N [SEED]", file=sys.stderr)
        return 2
    n = int(sys.argv[1])
    seed = int(sys.argv[2]) if len(sys.argv) > 2 else 42
    t0 = time.monotonic()
    rng = np.random.default_rng(seed)
    a = rng.random((n, n))
    b = rng.random((n, n))
    t1 = time.monotonic()
    c = a @ b
    t2 = time.monotonic()
    # Spot-check a few entries with plain dot products (touches rows of A and columns of B again).
    ok = True
    for i, j in [(0, 0), (n // 2, n // 3), (n - 1, n - 1)]:
        want = float(np.dot(a[i, :], b[:, j]))
        if abs(float(c[i, j]) - want) > 1e-6 * max(1.0, abs(want)):
            ok = False
    t3 = time.monotonic()
    print(json.dumps({"n": n, "operand_bytes": 3 * n * n * 8, "generate_s": t1 - t0,
                      "matmul_s": t2 - t1, "check_s": t3 - t2, "checksum_ok": ok}))
    return 0 if ok else 3


if __name__ == "__main__":
    sys.exit(main())
