# A parent whose state is mostly in the host tier forks a child, then changes everything the
# child reads: rewrites every page, frees the state and fills new memory. The child, reading
# only after all that, must see the state as it was at the fork. argv: MiB of state, mode:
#   rewrite  the parent rewrites, frees and refills while the child waits;
#   kill     the parent is killed (SIGKILL) right after the fork; the child reads afterwards;
#   chain    as rewrite, and the child forks a grandchild at once, which reads too (the
#            grandchild borrows what the child borrowed).
# Prints "ok <checksum>" per process that checked something, MISMATCH on a wrong one.
import hashlib
import os
import signal
import sys
import time

MIB = 1 << 20


def fill(n, seed):
    b = bytearray(n)
    for i in range(0, n, 4096):
        b[i] = (i // 4096 + seed) % 251
        b[i + 4095] = seed
    return b


def digest(b):
    return hashlib.sha256(b).hexdigest()[:16]


def parent_and_child(n, mode, out, parent):
    state = fill(n, 1)
    want = digest(state)
    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(go_w)
        if mode == "chain":
            grandchild = os.fork()  # both read below; the child reaps it
        if mode in ("rewrite", "chain"):
            os.read(go_r, 1)  # the parent has changed everything
        else:
            while os.getppid() == parent:  # until the parent is dead
                time.sleep(0.01)
        got = digest(state)
        os.write(out, (("ok " if got == want else "MISMATCH child ") + got + "\n").encode())
        if mode == "chain" and grandchild != 0:
            os.waitpid(grandchild, 0)
        os._exit(0)
    os.close(go_r)
    if mode == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    # Every page rewritten (the child's far pages must not change), then released (their far
    # pages must not be reused while the child lives) and new memory filled.
    for i in range(0, n, 4096):
        state[i] = 7
    rewritten = all(state[i] == 7 for i in range(0, n, 4096))
    del state
    other = fill(n, 2)
    os.write(go_w, b"gg")  # one byte for the child, one for a grandchild
    os.waitpid(pid, 0)
    same = digest(other) == digest(fill(n, 2))
    os.write(out, ("parent " + ("ok" if rewritten and same else "MISMATCH") + "\n").encode())


n = int(sys.argv[1]) * MIB
mode = sys.argv[2]
r, w = os.pipe()
mid = os.fork()
if mid == 0:
    os.close(r)
    parent_and_child(n, mode, w, os.getpid())
    os._exit(0)
os.close(w)
lines = b""
while True:
    chunk = os.read(r, 4096)
    if not chunk:
        break
    lines += chunk
os.waitpid(mid, 0)
sys.stdout.write(lines.decode())
