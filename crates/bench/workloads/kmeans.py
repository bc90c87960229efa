"""scikit-learn k-means for `farmem-bench compare --workload kmeans`.

Usage: kmeans.py SAMPLES FEATURES CLUSTERS ITERATIONS [SEED]

Generates SAMPLES x FEATURES float64 points around CLUSTERS random centres (the data set takes
SAMPLES * FEATURES * 8 bytes), then runs KMeans (Lloyd, one initialisation, a fixed number of
iterations with tol=0 so every system does the same work). Prints one JSON line with the phase
times and the inertia; exits 3 if the result is not finite (a corrupted page would show here).
"""
import json
import math
import sys
import time

import numpy as np
from sklearn.cluster import KMeans


def main() -> int:
    if len(sys.argv) < 5:
        print("usage: kmeans.py SAMPLES FEATURES CLUSTERS ITERATIONS [SEED]", file=sys.stderr)
        return 2
    samples, features, clusters, iterations = (int(v) for v in sys.argv[1:5])
    seed = int(sys.argv[5]) if len(sys.argv) > 5 else 42
    t0 = time.monotonic()
    rng = np.random.default_rng(seed)
    centres = rng.uniform(-1.0, 1.0, size=(clusters, features))
    x = np.empty((samples, features), dtype=np.float64)
    chunk = 65536
    for start in range(0, samples, chunk):
        end = min(samples, start + chunk)
        labels = rng.integers(0, clusters, size=end - start)
        x[start:end] = centres[labels] + rng.standard_normal((end - start, features))
    t1 = time.monotonic()
    km = KMeans(n_clusters=clusters, n_init=1, max_iter=iterations, tol=0.0,
                algorithm="lloyd", random_state=seed, copy_x=False)
    km.fit(x)
    t2 = time.monotonic()
    ok = math.isfinite(float(km.inertia_))
    print(json.dumps({"samples": samples, "features": features, "data_bytes": samples * features * 8,
                      "generate_s": t1 - t0, "fit_s": t2 - t1, "iterations": int(km.n_iter_),
                      "inertia": float(km.inertia_), "checksum_ok": ok}))
    return 0 if ok else 3


if __name__ == "__main__":
    sys.exit(main())
