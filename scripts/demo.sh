#!/usr/bin/env bash
# farmem's main job on a fresh machine: builds farmem (scripts/setup.sh), then runs a program that
# needs ~1 GiB — numpy on two 512 MiB matrices — with a 256 MiB local budget under `farmem run`,
# its overflow held by a private `farmem node` (the host tier: shared memory, one copy each way).
# Prints the program's result, then farmem's summary line (faults, host tier and remote bytes
# in/out, prefetch accuracy and coverage, peak resident).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec target/release/farmem run --local-mem 256MiB -- /usr/bin/python3 -c '
import numpy as np
n = 8192
a = np.random.default_rng(1).random((n, n))      # 512 MiB
b = np.sqrt(a) * 3.0 + a * a                     # another 512 MiB
print(f"sum of sqrt(a)*3 + a*a over {n}x{n}: {b.sum():.6f}")
'
