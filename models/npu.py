"""The NPU's one owner: a process takes this host's NPU lock before it opens the NPU, and holds it while it runs.

Owns the lock file and the message a second opener gets. A second process initialising the RK3588's NPU crashes
(rknn-llm issues #509 and #522; rk-llama.cpp warns that concurrent NPU processes can panic the kernel), so the second
opener fails here, naming the holder, instead of in the driver. The lock is flock(2) on a file every process of the
host sees (RINGSPEC_NPU_LOCK, default /run/lock/ringspec-npu.lock, else the temp directory): the kernel releases it
when its holder exits, however it exits, so a crashed owner never blocks the next. `one_owner` refuses up front a run
whose plan opens it in two processes at once (the benches' workers). Never opens the NPU itself.
"""
from __future__ import annotations

import fcntl
import json
import os
import tempfile
import time
from pathlib import Path


def lock_path() -> Path:
    if os.environ.get("RINGSPEC_NPU_LOCK"):
        return Path(os.environ["RINGSPEC_NPU_LOCK"])
    run = Path("/run/lock")
    return (run if os.access(run, os.W_OK) else Path(tempfile.gettempdir())) / "ringspec-npu.lock"


class NpuBusy(RuntimeError):
    """Another process holds the NPU."""


def one_owner(openers: list[str], remedy: str) -> None:
    """Refuse, before anything starts, a run that would open the NPU in more than one process at once (`openers`
    names each); `remedy` says what to change. The lock refuses the same at run time, one opener too late."""
    if len(openers) > 1:
        raise NpuBusy(f"{len(openers)} processes would open the NPU at once ({', '.join(openers)}): one process may "
                      f"hold the NPU, and a second one crashes it; {remedy}")


class NpuLock:
    def __init__(self, path: Path | None = None):
        self.path = Path(path) if path else lock_path()
        self._fd: int | None = None

    def acquire(self, what: str) -> None:
        """Hold the NPU for `what` (written into the file for the next opener's message); NpuBusy if held."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            raise NpuBusy(f"the NPU is held by pid {holder.get('pid', '?')} ({holder.get('what', '?')}, since "
                          f"{holder.get('since', '?')}; lock {self.path}): one process may open the NPU, and a "
                          f"second one crashes it, so stop that process or run this one's draft with "
                          f"draft.backend = \"onnx\"") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({"pid": os.getpid(), "what": what,
                                  "since": time.strftime("%Y-%m-%d %H:%M:%S")}).encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)                 # closing the descriptor releases the flock
            self._fd = None

    def __enter__(self) -> NpuLock:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def _holder(fd: int) -> dict:
    try:
        return json.loads(os.pread(fd, 4096, 0) or b"{}")
    except (OSError, ValueError):
        return {}
