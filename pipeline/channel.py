"""Channel: a single-producer single-consumer ring of preallocated message slots in one shared-memory segment.

Owns the segment layout (control words, slot headers, payload areas), the zmq PAIR wake-up socket beside it, and the
segment's lifetime (create, attach, close, unlink, stale cleanup). Moves headers and numpy arrays only: it never
pickles, never interprets a message, and never grows; every buffer is allocated once, in `Channel.create`.

Segment ``ringspec_<name>``, every region 64-byte aligned:
    [0, 512)                   control block: magic, geometry, owner pid and start time, head, tail, producer-waiting
                               flag, the ipc endpoint
    slot i at 512 + i*stride   [0, header_bytes): u32 length + msgpack [seq, header, [[name, dtype, shape, offset]..]]
                               [header_bytes, stride): payload, each array at a 64-byte aligned offset

Protocol. The producer writes slot seq % slots and then sends the 8-byte seq over the PAIR socket: the consumer blocks
in poll on that notification (no spinning), and the socket round trip is also what orders the slot writes before the
reads. The consumer frees slots in sequence order by advancing `tail` in shared memory. A producer that finds the ring
full raises `waiting` and sleeps in poll until the consumer answers with a one-byte credit; it re-reads `tail` every
few milliseconds, so a wake-up lost to a store/load race costs milliseconds, never a hang.

Hygiene. The owner unlinks the segment in `__exit__`, from an exit hook (plain exit, multiprocessing children) and on
SIGTERM (turned into SystemExit when the handler is still the default). Neither end tells multiprocessing's resource
tracker about the segment: an attacher's tracker would unlink the owner's segment at exit (the Python 3.11 pitfall),
and an owner's tracker that died and was relaunched answers the owner's own unlink with a KeyError traceback (seen
once in CI under Ray). `cleanup_stale` removes segments whose owner died without unlinking (SIGKILL, OOM kill).
It touches only what this user made: /dev/shm and the temp directory are shared with every local user, so a
segment or ipc file of another owner, a symlink, or an ipc path from a header outside the temp directory is skipped,
never read further, followed or unlinked, and an error on one candidate is logged, never fatal; `attach` refuses a
segment of another owner.
"""
from __future__ import annotations

import _posixshmem
import atexit
import mmap
import os
import re
import signal
import stat
import struct
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from multiprocessing import util

import msgpack
import numpy as np
import zmq

PREFIX = "ringspec_"
SHM_DIR = "/dev/shm"

_ALIGN = 64
_CONTROL_BYTES = 512
_MAGIC = 0x52535043 | (1 << 32)      # "RSPC", layout version 1
# u64 word indices in the control block; head, tail and waiting sit on separate cache lines
_W_MAGIC, _W_SLOTS, _W_HEADER, _W_PAYLOAD, _W_PID, _W_START = 0, 1, 2, 3, 4, 5
_W_HEAD, _W_TAIL, _W_WAITING, _W_ENDPOINT_LEN = 8, 16, 24, 32
_ENDPOINT_AT, _ENDPOINT_MAX = 264, _CONTROL_BYTES - 264
_SEQ = struct.Struct("<Q")
_LEN = struct.Struct("<I")
_CREDIT = b"c"
WAKE_MAX_BYTES = 256          # the wake-up socket's largest frame: a note is 8 bytes, but zmq's handshake commands
                              # (READY and its properties, ~40 bytes) are held to the same limit
_CREDIT_RECHECK_MS = 5
_NAME_RE = re.compile(r"[A-Za-z0-9_.-]{1,64}")


def _align(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


@dataclass(frozen=True)
class ChannelSpec:
    """Geometry of one channel: `slots` messages in flight, each with a msgpack header of at most `header_bytes`
    (including a 4-byte length) and arrays totalling at most `payload_bytes` (each array 64-byte aligned)."""
    name: str
    slots: int = 4
    payload_bytes: int = 1 << 20
    header_bytes: int = 1024

    def __post_init__(self):
        if not _NAME_RE.fullmatch(self.name):
            raise ValueError(f"channel name {self.name!r}: use 1-64 of [A-Za-z0-9_.-]")
        if self.slots < 1 or self.payload_bytes < 0 or self.header_bytes < 16:
            raise ValueError(f"bad geometry {self}: need slots >= 1, payload_bytes >= 0, header_bytes >= 16")

    @property
    def segment_name(self) -> str:
        return PREFIX + self.name

    @property
    def stride(self) -> int:
        return _align(self.header_bytes) + _align(self.payload_bytes)

    @property
    def segment_bytes(self) -> int:
        return _CONTROL_BYTES + self.slots * self.stride


class Message:
    """One received message. `arrays` are views into the slot, valid until `release()` (or the end of a `with`)."""
    __slots__ = ("seq", "header", "arrays", "_channel")

    def __init__(self, seq: int, header: dict, arrays: dict[str, np.ndarray], channel: Channel):
        self.seq, self.header, self.arrays, self._channel = seq, header, arrays, channel

    def release(self) -> None:
        channel, self._channel = self._channel, None
        if channel is not None:
            channel._release(self.seq)

    def __enter__(self) -> Message:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


class Channel:
    """One end of a ring. Exactly one end calls `send` and the other `recv`; the owner end also unlinks.
    A channel serves one attacher in its lifetime (a PAIR socket does not reliably take a second peer): to replace a
    dead peer, create a new channel."""

    def __init__(self, spec: ChannelSpec, mm: mmap.mmap, sock: zmq.Socket, endpoint: str, owner: bool):
        self.spec, self.endpoint, self.is_owner = spec, endpoint, owner
        self._mmap, self._mv, self._sock = mm, memoryview(mm), sock
        self._buf = np.frombuffer(self._mv, dtype=np.uint8)
        self._ctl = self._buf[:_CONTROL_BYTES].view("<u8")
        self._payload_at = _align(spec.header_bytes)
        self._head = int(self._ctl[_W_HEAD])          # producer: next seq to write
        self._next = int(self._ctl[_W_TAIL])          # consumer: next seq to receive
        self._announced = self._next                  # consumer: seqs a notification announced, + 1
        self.max_depth = 0                            # consumer: most messages seen waiting at one receive
        self._tail = self._next                       # consumer: first seq not yet released
        self._released: set[int] = set()
        self._pid = os.getpid()
        self._closed = self._unlinked = False

    # ---- lifetime -------------------------------------------------------------------------------------------------

    @classmethod
    def create(cls, spec: ChannelSpec, *, exit_on_sigterm: bool = True) -> Channel:
        """Create the segment and bind the wake-up socket. Replaces a leftover segment of a dead owner."""
        try:
            _create_untracked(spec.segment_name, spec.segment_bytes)
        except FileExistsError:
            if not _remove_if_stale(spec.segment_name):
                raise FileExistsError(f"shared memory {spec.segment_name} exists and is not a dead owner's of this "
                                      f"user (its owner is alive, or it is another user's)") from None
            _create_untracked(spec.segment_name, spec.segment_bytes)
        endpoint = f"ipc://{tempfile.gettempdir()}/{spec.segment_name}.ipc"
        sock = None
        try:
            mm = _map_untracked(spec.segment_name)
            owner = np.frombuffer(mm, "<u8", count=_W_START + 1)       # whose it is, before anything can fail: a
            owner[_W_PID], owner[_W_START] = os.getpid(), _start_time(os.getpid())   # creator killed mid-way
            del owner                                                  # leaves a segment cleanup_stale can judge
            sock = _queues(_socket(), spec.slots)
            sock.bind(endpoint)
            channel = cls(spec, mm, sock, endpoint, owner=True)
            ctl, raw = channel._ctl, endpoint.encode()
            ctl[[_W_SLOTS, _W_HEADER, _W_PAYLOAD]] = spec.slots, spec.header_bytes, spec.payload_bytes
            ctl[_W_ENDPOINT_LEN] = len(raw)
            channel._buf[_ENDPOINT_AT:_ENDPOINT_AT + len(raw)] = np.frombuffer(raw, np.uint8)
            ctl[_W_MAGIC] = _MAGIC                    # last: attachers wait for it
        except BaseException:
            if sock is not None:
                sock.close(linger=0)
                _unlink_ipc(endpoint)
            _posixshmem.shm_unlink("/" + spec.segment_name)
            raise
        _OWNED.add(channel)
        _install_exit_hooks(exit_on_sigterm)
        return channel

    @classmethod
    def attach(cls, spec_or_name: ChannelSpec | str, *, timeout: float | None = 10.0) -> Channel:
        """Map an existing channel (waiting up to `timeout` s for its owner) and connect to its socket."""
        expected = spec_or_name if isinstance(spec_or_name, ChannelSpec) else None
        name = expected.name if expected else spec_or_name
        deadline = _deadline(timeout)
        while True:
            mm = _map_untracked(PREFIX + name)
            if mm is not None:
                ctl = np.frombuffer(mm, "<u8", count=_CONTROL_BYTES // 8)
                if ctl[_W_MAGIC] == _MAGIC:
                    break
                del ctl
                mm.close()
            if _ms(deadline) == 0:
                raise TimeoutError(f"channel {PREFIX + name} did not appear within {timeout}s")
            time.sleep(0.005)
        spec = ChannelSpec(name, int(ctl[_W_SLOTS]), int(ctl[_W_PAYLOAD]), int(ctl[_W_HEADER]))
        endpoint = bytes(mm[_ENDPOINT_AT:_ENDPOINT_AT + int(ctl[_W_ENDPOINT_LEN])]).decode()
        del ctl
        if expected is not None and expected != spec:
            mm.close()
            raise ValueError(f"channel {name}: segment has {spec}, caller expected {expected}")
        sock = _queues(_socket(), spec.slots)
        sock.connect(endpoint)
        return cls(spec, mm=mm, sock=sock, endpoint=endpoint, owner=False)

    def close(self) -> None:
        """Drop this end's socket and mapping. Views still held by the caller keep the mapping alive until freed."""
        if self._closed:
            return
        self._closed = True
        self._sock.close(linger=0)
        if self.is_owner:
            _unlink_ipc(self.endpoint)                # libzmq leaves a bound ipc file behind
        self._buf = self._ctl = None
        try:
            self._mv.release()
            self._mmap.close()
        except BufferError:
            pass      # the caller still holds message arrays; the mapping goes with them

    def unlink(self) -> None:
        """Owner only: remove the segment name (mappings stay valid until closed)."""
        if not self.is_owner:
            raise RuntimeError("only the owner unlinks a channel")
        if self._unlinked:
            return
        self._unlinked = True
        _OWNED.discard(self)
        try:
            _posixshmem.shm_unlink("/" + self.spec.segment_name)
        except FileNotFoundError:
            pass

    def __enter__(self) -> Channel:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
        if self.is_owner:
            self.unlink()

    @property
    def buffer(self) -> np.ndarray:
        """The whole segment as uint8 (for zero-copy checks and in-place I/O binding)."""
        return self._buf

    # ---- producer ----------------------------------------------------------------------------------------------------

    def send(self, header: dict | None = None, arrays: dict[str, np.ndarray] | None = None,
             timeout: float | None = None) -> int:
        """Copy `header` (plain msgpack types) and `arrays` into the next slot and wake the consumer; returns the seq.
        Blocks while the ring is full; TimeoutError after `timeout` s; ValueError if the message cannot fit."""
        self._check_open()
        seq, spec = self._head, self.spec
        layout, descr, used = [], [], 0
        for name, array in (arrays or {}).items():
            if not isinstance(array, np.ndarray) or array.dtype.kind not in "biufc":
                raise ValueError(f"array {name!r}: need a numeric numpy array, got {type(array).__name__}")
            layout.append((used, array))
            descr.append([name, array.dtype.str, list(array.shape), used])
            used = _align(used + array.nbytes)
        if layout and layout[-1][0] + layout[-1][1].nbytes > spec.payload_bytes:
            sizes = ", ".join(f"{d[0]}: {a.nbytes}" for d, (_, a) in zip(descr, layout))
            raise ValueError(f"payload of {layout[-1][0] + layout[-1][1].nbytes} bytes ({sizes}; 64-byte aligned) "
                             f"exceeds the slot capacity of {spec.payload_bytes} bytes on channel {spec.name}")
        packed = msgpack.packb([seq, header or {}, descr], use_bin_type=True)
        if _LEN.size + len(packed) > spec.header_bytes:
            raise ValueError(f"header of {_LEN.size + len(packed)} bytes exceeds the slot header capacity of "
                             f"{spec.header_bytes} bytes on channel {spec.name}")

        deadline = _deadline(timeout)
        self._wait_for_free_slot(seq, deadline, timeout)
        base = _CONTROL_BYTES + (seq % spec.slots) * spec.stride
        _LEN.pack_into(self._mv, base, len(packed))
        self._mv[base + _LEN.size:base + _LEN.size + len(packed)] = packed
        start = base + self._payload_at
        for offset, array in layout:
            if array.nbytes:
                slot = self._buf[start + offset:start + offset + array.nbytes].view(array.dtype)
                np.copyto(slot.reshape(array.shape), array, casting="no")
        self._notify(_SEQ.pack(seq), deadline, timeout)
        self._head = seq + 1
        self._ctl[_W_HEAD] = seq + 1
        return seq

    def _wait_for_free_slot(self, seq: int, deadline, timeout) -> None:
        slots = self.spec.slots
        if seq - int(self._ctl[_W_TAIL]) < slots:
            return
        self._ctl[_W_WAITING] = 1
        try:
            while seq - int(self._ctl[_W_TAIL]) >= slots:      # re-read after raising the flag
                wait = _ms(deadline, cap=_CREDIT_RECHECK_MS)
                if wait == 0:
                    raise TimeoutError(f"channel {self.spec.name}: ring of {slots} slots still full after {timeout}s")
                if self._sock.poll(wait, zmq.POLLIN):
                    while self._sock.poll(0, zmq.POLLIN):
                        self._sock.recv()                       # credits carry no data
        finally:
            self._ctl[_W_WAITING] = 0

    def _notify(self, note: bytes, deadline, timeout) -> None:
        while True:
            try:
                self._sock.send(note, zmq.NOBLOCK)
                return
            except zmq.Again:
                wait = _ms(deadline)
                if wait == 0 or not self._sock.poll(wait, zmq.POLLOUT):
                    raise TimeoutError(f"channel {self.spec.name}: no consumer connected within {timeout}s") from None

    def in_flight(self) -> int:
        """Producer end: messages sent that the consumer has not released yet (waiting, or being worked on)."""
        return self._head - int(self._ctl[_W_TAIL])

    # ---- consumer ----------------------------------------------------------------------------------------------------

    def recv(self, timeout: float | None = None) -> Message:
        """Wait for the next message; TimeoutError after `timeout` s. Release it to free the slot."""
        self._check_open()
        deadline = _deadline(timeout)
        # `head` in shared memory is the truth; a notification only wakes us. A producer that exits right after
        # sending may take its last notifications with it (its socket closes with linger 0): the data is in the
        # slots all the same, and `head` says so.
        while not self.ready():
            wait = _ms(deadline, cap=_CREDIT_RECHECK_MS)
            if wait == 0:
                raise TimeoutError(f"channel {self.spec.name}: no message within {timeout}s")
            if self._sock.poll(wait, zmq.POLLIN):
                self._drain_notes()
        self._drain_notes()                            # wake-ups for messages head already announced
        seq = self._next
        self._next = seq + 1
        self.max_depth = max(self.max_depth, max(int(self._ctl[_W_HEAD]), self._announced) - seq)
        base = _CONTROL_BYTES + (seq % self.spec.slots) * self.spec.stride
        length, = _LEN.unpack_from(self._mv, base)
        slot_seq, header, descr = msgpack.unpackb(self._mv[base + _LEN.size:base + _LEN.size + length], raw=False)
        if slot_seq != seq:
            raise RuntimeError(f"channel {self.spec.name}: slot holds seq {slot_seq}, notification said {seq}")
        start = base + self._payload_at
        arrays = {}
        for name, dtype, shape, offset in descr:
            dtype = np.dtype(dtype)
            nbytes = dtype.itemsize * int(np.prod(shape, dtype=np.int64))
            arrays[name] = self._buf[start + offset:start + offset + nbytes].view(dtype).reshape(shape)
        return Message(seq, header, arrays, self)

    def ready(self) -> bool:
        """A message is waiting (never blocks): head says so, or a notification did (the producer writes its slot,
        notifies, then advances head; a consumer woken in between must not sleep again)."""
        return max(int(self._ctl[_W_HEAD]), self._announced) > self._next

    def written(self) -> int:
        """Messages the producer has written so far (consumer end; never blocks): message `seq` is in the ring
        once this exceeds it."""
        return int(self._ctl[_W_HEAD])

    def depth(self) -> int:
        """Messages waiting to be received (consumer end; never blocks)."""
        return max(int(self._ctl[_W_HEAD]), self._announced) - self._next

    def _drain_notes(self) -> None:
        while self._sock.poll(0, zmq.POLLIN):
            note = self._sock.recv()
            if len(note) == _SEQ.size:
                self._announced = max(self._announced, _SEQ.unpack(note)[0] + 1)

    def _release(self, seq: int) -> None:
        if self._closed:
            return
        self._released.add(seq)
        tail = self._tail
        while tail in self._released:                 # slots free strictly in order, whatever order releases come in
            self._released.remove(tail)
            tail += 1
        if tail != self._tail:
            self._tail = tail
            self._ctl[_W_TAIL] = tail
            if self._ctl[_W_WAITING]:
                try:
                    self._sock.send(_CREDIT, zmq.NOBLOCK)
                except zmq.Again:
                    pass                              # the producer re-reads tail within a few ms anyway

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"channel {self.spec.name} is closed")


class Selector:
    """Waits on the consumer ends of several channels at once (the cache owner hears the target and the draft), and
    on plain zmq sockets beside them (`sockets`: the output actor's link to a site, pipeline/serve/site_link.py)."""

    def __init__(self, channels, sockets=()):
        self.channels, self.sockets = list(channels), list(sockets)
        self._poller = zmq.Poller()
        for sock in [ch._sock for ch in self.channels] + self.sockets:
            self._poller.register(sock, zmq.POLLIN)

    def wait(self, timeout: float | None = None) -> list[Channel]:
        """The channels with a message waiting, within `timeout` s ([] on timeout, and at once when one of
        `sockets` has input: the caller reads it). Head in shared memory is the truth; notifications only wake the
        poll, and stale ones are drained here."""
        deadline = _deadline(timeout)
        while True:
            ready = [ch for ch in self.channels if ch.ready()]
            if ready:
                return ready
            wait = _ms(deadline, cap=_CREDIT_RECHECK_MS)
            if wait == 0:
                return []
            woken = dict(self._poller.poll(wait))
            if any(sock in woken for sock in self.sockets):
                return [ch for ch in self.channels if ch.ready()]
            if woken:
                for ch in self.channels:
                    ch._drain_notes()


# ---- segment hygiene ---------------------------------------------------------------------------------------------

_OWNED: set[Channel] = set()     # owner ends not yet unlinked: at exit each is unlinked, even one its creator dropped
_hooks_pid = None


def _close_owned() -> None:
    for channel in list(_OWNED):
        if channel._pid == os.getpid():               # a forked child inherits the set but owns nothing
            channel.__exit__(None, None, None)


def _exit_on_sigterm(signum, frame):
    raise SystemExit(128 + signum)


def _install_exit_hooks(exit_on_sigterm: bool) -> None:
    global _hooks_pid
    if _hooks_pid != os.getpid():
        _hooks_pid = os.getpid()
        atexit.register(_close_owned)
        # multiprocessing children leave through os._exit, which skips atexit but runs these finalizers
        util.Finalize(None, _close_owned, exitpriority=10)
    if (exit_on_sigterm and threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL):
        signal.signal(signal.SIGTERM, _exit_on_sigterm)


def cleanup_stale(prefix: str = PREFIX) -> list[str]:
    """Unlink the /dev/shm/<prefix>* channel segments (and ipc files) whose owner process is dead; returns names.

    Also removes <tmp>/<prefix>*.ipc files whose segment is gone: a killed owner's resource tracker unlinks the
    segment but not the socket file. (An owner binds its socket only after creating its segment, and unbinds before
    unlinking it, so a socket file without a segment is always a leftover.) Only this user's files named with PREFIX
    are candidates (see Hygiene); one that cannot be read or removed is logged and skipped, so a restart goes on."""
    names = []
    for name in sorted(os.listdir(SHM_DIR)):
        if name.startswith(PREFIX) and name.startswith(prefix) and _skip_errors(_remove_if_stale, name):
            names.append(name)
    tmp = tempfile.gettempdir()
    for entry in sorted(os.listdir(tmp)):
        if (entry.startswith(PREFIX) and entry.startswith(prefix) and entry.endswith(".ipc")
                and not os.path.lexists(f"{SHM_DIR}/{entry[:-4]}")
                and _skip_errors(_unlink_own_ipc, f"ipc://{tmp}/{entry}")):
            names.append(entry)
    return names


def _skip_errors(clean, name: str) -> bool:
    try:
        return clean(name)
    except (OSError, ValueError) as exc:                # a planted or vanishing file must not stop a restart
        print(f"ringspec: warning: stale-channel cleanup skipped {name}: {exc}", file=sys.stderr, flush=True)
        return False


def _remove_if_stale(segment_name: str) -> bool:
    try:       # O_NOFOLLOW: a symlink is never followed; O_NONBLOCK: a planted fifo cannot hang the open
        fd = os.open(os.path.join(SHM_DIR, segment_name), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return False
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            return False                              # not ours: neither read further nor unlinked (see Hygiene)
        control = os.pread(fd, _CONTROL_BYTES, 0)
    finally:
        os.close(fd)
    if len(control) < _CONTROL_BYTES:
        return False                                  # being created, or not a channel
    words = struct.unpack_from("<64Q", control)
    if not words[_W_PID] or _alive(words[_W_PID], words[_W_START]):
        return False                                  # not a channel, its creator's first write to come, or alive
    try:
        _posixshmem.shm_unlink("/" + segment_name)
    except FileNotFoundError:
        return False
    if words[_W_MAGIC] == _MAGIC and words[_W_ENDPOINT_LEN] <= _ENDPOINT_MAX:
        endpoint = control[_ENDPOINT_AT:_ENDPOINT_AT + words[_W_ENDPOINT_LEN]].decode(errors="replace")
    else:                                             # its creator died before writing the endpoint: the one it binds
        endpoint = f"ipc://{tempfile.gettempdir()}/{segment_name}.ipc"
    _unlink_own_ipc(endpoint)
    return True


def _own_ipc_path(endpoint: str) -> str | None:
    """The socket file `endpoint` names when it is one a channel of this user binds: a socket (not a symlink) owned
    by us, named with PREFIX, directly in the temp directory. None for anything else: a header's endpoint is data
    that whoever could write the segment wrote."""
    if not endpoint.startswith("ipc://") or "\0" in endpoint:
        return None
    ipc_dir = os.path.realpath(tempfile.gettempdir())
    parent, name = os.path.split(os.path.abspath(endpoint[len("ipc://"):]))
    if os.path.realpath(parent) != ipc_dir or not name.startswith(PREFIX) or not name.endswith(".ipc"):
        return None
    path = os.path.join(ipc_dir, name)
    try:
        st = os.lstat(path)                           # lstat: the link itself, never where it points
    except FileNotFoundError:
        return None
    return path if stat.S_ISSOCK(st.st_mode) and st.st_uid == os.geteuid() else None


def _unlink_own_ipc(endpoint: str) -> bool:
    path = _own_ipc_path(endpoint)
    if path is None:
        return False
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    return True


def _unlink_ipc(endpoint: str) -> None:
    """An owner's own socket file (its endpoint, which it made)."""
    if endpoint.startswith("ipc://"):
        try:
            os.unlink(endpoint[len("ipc://"):])
        except OSError:
            pass


def _proc_stat(pid: int) -> list[bytes] | None:
    """Fields 3.. of /proc/<pid>/stat (state first, start time at index 19), or None if there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    return stat[stat.rindex(b")") + 2:].split()


def _start_time(pid: int) -> int:
    fields = _proc_stat(pid)
    return int(fields[19]) if fields else 0


def _alive(pid: int, start_time: int) -> bool:
    """Is the owner still running? The start time guards against a recycled pid; zombies count as dead."""
    if not os.path.isdir("/proc/self"):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
        return True
    fields = _proc_stat(pid)
    if fields is None or fields[0] in (b"Z", b"X"):
        return False
    return start_time == 0 or int(fields[19]) == start_time


def _create_untracked(segment_name: str, size: int) -> None:
    """Create and size a segment (FileExistsError if the name is taken) without a resource tracker (see Hygiene)."""
    fd = _posixshmem.shm_open("/" + segment_name, os.O_CREAT | os.O_EXCL | os.O_RDWR, mode=0o600)
    try:
        os.ftruncate(fd, size)
    finally:
        os.close(fd)


def _map_untracked(segment_name: str) -> mmap.mmap | None:
    """Map an existing segment without registering it with this process's resource tracker (SharedMemory in 3.11
    would, and that tracker unlinks it when this process exits; unregistering afterwards is no better, because
    multiprocessing children share their parent's tracker and would drop the owner's registration)."""
    try:
        fd = _posixshmem.shm_open("/" + segment_name, os.O_RDWR, mode=0o600)
    except FileNotFoundError:
        return None
    try:
        st = os.fstat(fd)
        if st.st_uid != os.geteuid():                  # another user's segment: its header and wake-up are not ours
            raise PermissionError(f"shared memory {segment_name} belongs to uid {st.st_uid}, not this user "
                                  f"({os.geteuid()}): refusing to attach")
        size = st.st_size
        return mmap.mmap(fd, size) if size >= _CONTROL_BYTES else None   # owner may not have sized it yet
    finally:
        os.close(fd)


def _socket() -> zmq.Socket:
    """The wake-up PAIR: a peer sending a frame over WAKE_MAX_BYTES is cut off by zmq (an ipc peer of this user's
    other than the channel's end)."""
    sock = zmq.Context.instance().socket(zmq.PAIR)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.MAXMSGSIZE, WAKE_MAX_BYTES)
    return sock


def _queues(sock: zmq.Socket, slots: int) -> zmq.Socket:
    """The wake-up PAIR's queues sized to its protocol (before it binds or connects): a note per slot written and
    not yet read, and a credit per wait, so at most `slots` + a few of either are ever queued."""
    sock.setsockopt(zmq.SNDHWM, 2 * slots + 16)
    sock.setsockopt(zmq.RCVHWM, 2 * slots + 16)
    return sock


def _deadline(timeout: float | None) -> float | None:
    return None if timeout is None else time.monotonic() + max(0.0, timeout)


def _ms(deadline: float | None, cap: int | None = None) -> int | None:
    """Milliseconds left before `deadline` (None: forever, or `cap` when given), at least 1 unless expired."""
    if deadline is None:
        return cap
    left = deadline - time.monotonic()
    if left <= 0:
        return 0
    ms = max(1, int(left * 1000 + 0.999))
    return ms if cap is None else min(ms, cap)
