# A parent whose state is on donors forks a child that reads it only when told. Meanwhile the
# test kills donors, so that every copy of a page the child knew at the fork may be gone while
# the parent has healed it elsewhere. argv: MiB of state. Prints "forked" once the child exists,
# then waits for a line on stdin (the donors are killed), lets the child read and prints the
# child's "ok <checksum>" (or MISMATCH) and its exit status.
import hashlib
import os
import sys

MIB = 1 << 20
n = int(sys.argv[1]) * MIB
state = bytearray(n)
for i in range(0, n, 4096):
    state[i] = (i // 4096) % 251
    state[i + 4095] = 1
want = hashlib.sha256(state).hexdigest()[:16]
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    os.close(w)
    os.read(r, 1)
    got = hashlib.sha256(state).hexdigest()[:16]
    print(("ok " if got == want else "MISMATCH ") + got, flush=True)
    os._exit(0)
os.close(r)
print("forked", flush=True)
sys.stdin.readline()
os.write(w, b"g")
_, status = os.waitpid(pid, 0)
print("child status %d" % status, flush=True)
