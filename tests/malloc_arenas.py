"""A stand-in actor for tests/pipeline/test_launch.py: eight threads allocate through the C library at once, then
the process's glibc malloc arenas besides the main one are counted from /proc/self/maps and written to `out`."""
from __future__ import annotations

import ctypes
import threading

HEAP = 64 << 20          # a 64-bit glibc's non-main arena: a 64 MiB-aligned heap, its reserve mapped ---p


def extra_arenas(pid: str = "self") -> int:
    rows = []
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            parts = line.split()
            a, b = (int(x, 16) for x in parts[0].split("-"))
            rows.append((a, b, parts[1], len(parts) > 5))
    return sum(1 for (a, b, perm, named), nxt in zip(rows, rows[1:])
               if not named and a % HEAP == 0 and perm.startswith("rw") and nxt[0] == b and nxt[2] == "---p"
               and nxt[1] - a == HEAP)


def run(out: str) -> None:
    libc = ctypes.CDLL(None)
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    go = threading.Barrier(8)

    def churn():
        go.wait()
        for _ in range(20_000):           # ctypes drops the GIL around each call: the threads contend for the lock
            libc.free(libc.malloc(4096))

    threads = [threading.Thread(target=churn) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    with open(out, "w") as f:
        f.write(str(extra_arenas()))
