"""pipeline.channel: data crosses real processes intact and zero-copy, in order under backpressure, and no segment
outlives its owner on any exit path."""
from __future__ import annotations

import multiprocessing as mp
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from pathlib import Path

import numpy as np
import pytest

from pipeline.channel import PREFIX, SHM_DIR, Channel, ChannelSpec, cleanup_stale
from tests import procs
from tests.paths import ROOT

SPAWN = mp.get_context("spawn")


def _spec(tag: str, **geometry) -> ChannelSpec:
    return ChannelSpec(f"test_{tag}_{uuid.uuid4().hex[:8]}", **geometry)


def _segment_exists(spec: ChannelSpec) -> bool:
    return os.path.exists(os.path.join(SHM_DIR, spec.segment_name))


def _start(target, *args):
    proc = SPAWN.Process(target=target, args=args, daemon=True)
    proc.start()
    return proc


# ---- children (module level so spawn can import them) -------------------------------------------------------------

def _echo(req_name: str, rep_name: str, count: int) -> None:
    """Receive `count` messages and answer each with its header, its arrays and whether they were views."""
    with Channel.attach(req_name) as req, Channel.attach(rep_name) as rep:
        for _ in range(count):
            with req.recv(timeout=10) as msg:
                views = all(np.shares_memory(a, req.buffer) for a in msg.arrays.values() if a.size)
                rep.send({**msg.header, "views": views}, msg.arrays, timeout=10)


def _ack(req_name: str, rep_name: str, count: int) -> None:
    """Answer each message with a tiny header: its seq, block, and a checksum of what arrived (the probe's far end)."""
    with Channel.attach(req_name) as req, Channel.attach(rep_name) as rep:
        for _ in range(count):
            with req.recv(timeout=10) as msg:
                rep.send({"seq": msg.seq, "block": msg.header["block"],
                          "sum": float(msg.arrays["logits"][:, ::97].sum()) + int(msg.arrays["tokens"].sum())},
                         timeout=10)


def _slow_consumer(req_name: str, rep_name: str, count: int) -> None:
    """Consume slower than the producer sends, checking every message is the next one, intact."""
    errors = []
    with Channel.attach(req_name) as req, Channel.attach(rep_name) as rep:
        for i in range(count):
            with req.recv(timeout=10) as msg:
                if msg.seq != i or msg.header["i"] != i or not (msg.arrays["x"] == i).all():
                    errors.append((i, msg.seq, msg.header["i"], int(msg.arrays["x"][0])))
                if i % 8 == 0:
                    time.sleep(0.001)
        rep.send({"received": count, "errors": errors[:5]}, timeout=10)


def _owner_waits(name: str, ready) -> None:
    with Channel.create(ChannelSpec(name, slots=2, payload_bytes=1024)) as channel:
        ready.set()
        channel.recv(timeout=60)


def _attacher_waits(name: str, ready) -> None:
    channel = Channel.attach(name)
    ready.set()
    channel.recv(timeout=60)


def _attach_and_exit(name: str) -> None:
    Channel.attach(name).close()


# ---- data path ---------------------------------------------------------------------------------------------------

def test_round_trip_across_processes_is_equal_and_zero_copy():
    arrays = {
        "tokens": np.array([5, -7, 1 << 40, 3], dtype=np.int64),
        "logits": np.random.default_rng(0).standard_normal((4, 1000)).astype(np.float32),
        "empty": np.zeros((0, 3), dtype=np.float32),
        "scalar": np.array(9, dtype=np.int64),
        "strided": np.arange(20, dtype=np.int64)[::2],
    }
    req_spec, rep_spec = _spec("req", payload_bytes=1 << 16), _spec("rep", payload_bytes=1 << 16)
    with Channel.create(req_spec) as req, Channel.create(rep_spec) as rep:
        child = _start(_echo, req_spec.name, rep_spec.name, 1)
        assert req.send({"block": 3, "text": "ä<|im_start|>"}, arrays, timeout=10) == 0
        with rep.recv(timeout=10) as msg:
            assert msg.seq == 0
            assert msg.header == {"block": 3, "text": "ä<|im_start|>", "views": True}
            assert set(msg.arrays) == set(arrays)
            for name, sent in arrays.items():
                got = msg.arrays[name]
                assert got.dtype == sent.dtype and got.shape == sent.shape
                np.testing.assert_array_equal(got, sent)
                assert got.size == 0 or np.shares_memory(got, rep.buffer)
        child.join(10)
        assert child.exitcode == 0


def test_fast_producer_on_four_slots_never_loses_or_reorders():
    count = 2000
    req_spec, rep_spec = _spec("req", slots=4, payload_bytes=4096), _spec("rep")
    with Channel.create(req_spec) as req, Channel.create(rep_spec) as rep:
        child = _start(_slow_consumer, req_spec.name, rep_spec.name, count)
        x = np.empty(256, dtype=np.int64)
        for i in range(count):
            x.fill(i)
            assert req.send({"i": i}, {"x": x}, timeout=10) == i
        with rep.recv(timeout=20) as verdict:
            assert verdict.header == {"received": count, "errors": []}
        child.join(10)
        assert child.exitcode == 0


def test_timeouts_raise_timeout_error():
    spec = _spec("timeout", slots=2, payload_bytes=64)
    with Channel.create(spec) as owner:
        with pytest.raises(TimeoutError):
            owner.send({}, timeout=0.05)                # nobody connected
        with Channel.attach(spec.name) as consumer:
            with pytest.raises(TimeoutError):
                consumer.recv(timeout=0.05)             # nothing sent
            owner.send({}, timeout=1)
            owner.send({}, timeout=1)
            t0 = time.monotonic()
            with pytest.raises(TimeoutError, match="full"):
                owner.send({}, timeout=0.1)            # both slots unreleased
            assert 0.09 < time.monotonic() - t0 < 1.0
            consumer.recv(timeout=1).release()
            assert owner.send({}, timeout=1) == 2       # a release frees exactly one slot
    with pytest.raises(TimeoutError):
        Channel.attach(_spec("absent").name, timeout=0.05)


def test_oversized_payload_and_header_raise_value_error_with_sizes():
    with Channel.create(_spec("big", payload_bytes=4096, header_bytes=128)) as owner:
        with pytest.raises(ValueError, match=r"payload of 4160 bytes .*capacity of 4096 bytes"):
            owner.send({}, {"a": np.zeros(16, np.float32), "b": np.zeros(4096, np.uint8)})
        with pytest.raises(ValueError, match=r"header of \d+ bytes exceeds .* 128 bytes"):
            owner.send({"text": "x" * 200})
        with pytest.raises(ValueError, match="numeric numpy array"):
            owner.send({}, {"a": np.array(["s"], dtype=object)})


# ---- segment hygiene ---------------------------------------------------------------------------------------------

def test_normal_run_leaves_no_segment_or_socket():
    spec = _spec("normal")
    with Channel.create(spec) as owner:
        assert _segment_exists(spec)
        endpoint_file = owner.endpoint[len("ipc://"):]
    assert not _segment_exists(spec)
    deadline = time.monotonic() + 2
    while os.path.exists(endpoint_file) and time.monotonic() < deadline:
        time.sleep(0.01)                                # zmq removes its ipc file from its own thread
    assert not os.path.exists(endpoint_file)


def test_owner_raising_inside_with_unlinks():
    spec = _spec("raise")
    with pytest.raises(KeyError):
        with Channel.create(spec):
            raise KeyError("boom")
    assert not _segment_exists(spec)


def test_sigterm_of_owner_child_unlinks():
    spec, ready = _spec("sigterm"), SPAWN.Event()
    child = _start(_owner_waits, spec.name, ready)
    assert ready.wait(20) and _segment_exists(spec)
    child.terminate()                                   # SIGTERM while blocked in recv
    child.join(10)
    assert child.exitcode == 128 + signal.SIGTERM
    assert not _segment_exists(spec)


def test_sigkill_of_attacher_child_leaves_owner_in_charge():
    spec, ready = _spec("sigkill_attacher"), SPAWN.Event()
    with Channel.create(spec) as owner:
        child = _start(_attacher_waits, spec.name, ready)
        assert ready.wait(20)
        child.kill()
        child.join(10)
        assert child.exitcode == -signal.SIGKILL
        assert _segment_exists(spec)
        # A dead consumer makes the producer time out, not hang. zmq notices the peer's death in its own I/O thread,
        # maybe after the first sends (they queue); by the time the ring is full, nobody has freed a slot.
        with pytest.raises(TimeoutError, match="no consumer|still full"):
            for _ in range(spec.slots + 1):
                owner.send({}, timeout=0.1)
    assert not _segment_exists(spec)


def test_attacher_exit_does_not_unlink_owner_segment():
    """The Python 3.11 pitfall: a process with its own resource tracker (a fresh interpreter) and a multiprocessing
    child (sharing ours) both attach and exit; the segment must survive both."""
    spec = _spec("pitfall")
    with Channel.create(spec):
        code = f"from pipeline.channel import Channel; Channel.attach({spec.name!r}).close()"
        procs.run([sys.executable, "-c", code], cwd=ROOT, check=True)
        time.sleep(0.2)                                 # a tracker would unlink as it shuts down, after the exit
        assert _segment_exists(spec)
        child = _start(_attach_and_exit, spec.name)
        child.join(20)
        assert child.exitcode == 0 and _segment_exists(spec)
    assert not _segment_exists(spec)


def _sigkilled_owner(spec: ChannelSpec) -> str:
    """Run an owner in a new session and SIGKILL the whole session, its resource tracker included (as a cgroup kill
    or the OOM killer would), so nothing cleans up after it. Returns the owner's ipc socket file."""
    code = textwrap.dedent(f"""
        import time
        from pipeline.channel import Channel, ChannelSpec
        print(Channel.create(ChannelSpec({spec.name!r})).endpoint, flush=True)
        time.sleep(60)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        endpoint_file = proc.stdout.readline().strip()[len("ipc://"):]
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
        proc.stdout.close()
    assert _segment_exists(spec) and os.path.exists(endpoint_file)
    return endpoint_file


def test_cleanup_stale_removes_segment_of_sigkilled_owner_only():
    spec, live = _spec("stale"), _spec("live")
    endpoint_file = _sigkilled_owner(spec)
    with Channel.create(live):
        removed = cleanup_stale(PREFIX + "test_")
        assert spec.segment_name in removed and live.segment_name not in removed
        assert not _segment_exists(spec) and not os.path.exists(endpoint_file)
        assert _segment_exists(live)
    assert not _segment_exists(live)


def test_an_owner_killed_outright_leaves_segment_and_socket_file_and_cleanup_stale_removes_both():
    """No resource tracker stands behind a segment (pipeline/channel.py, Hygiene): what a SIGKILLed owner leaves,
    the launcher's cleanup_stale removes, segment and ipc socket file alike."""
    spec = _spec("tracked")
    code = textwrap.dedent(f"""
        import time
        from pipeline.channel import Channel, ChannelSpec
        print(Channel.create(ChannelSpec({spec.name!r})).endpoint, flush=True)
        time.sleep(60)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True,
                            stderr=subprocess.PIPE)
    endpoint_file = proc.stdout.readline().strip()[len("ipc://"):]
    proc.kill()
    proc.wait(10)
    proc.stdout.close()
    assert "resource_tracker" not in proc.stderr.read()
    proc.stderr.close()
    assert _segment_exists(spec) and os.path.exists(endpoint_file)
    assert spec.segment_name in cleanup_stale(PREFIX + "test_")
    assert not _segment_exists(spec) and not os.path.exists(endpoint_file)


def test_an_owner_killed_while_it_creates_its_channel_leaves_what_cleanup_stale_removes():
    """Found in CI: a launcher SIGKILLed just as its actors started left a segment without its magic word (its
    creator died before binding its socket), which cleanup_stale took for "being created" and kept forever. The
    creator's pid is now written first, so a dead one's half-made segment is stale too."""
    spec = _spec("midcreate")
    code = textwrap.dedent(f"""
        import os
        from pipeline import channel
        channel._socket = lambda: os.kill(os.getpid(), 9)      # dies after the segment is made, before its socket
        channel.Channel.create(channel.ChannelSpec({spec.name!r}))
    """)
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == -signal.SIGKILL and _segment_exists(spec)
    assert spec.segment_name in cleanup_stale(PREFIX + "test_")
    assert not _segment_exists(spec)


def test_create_replaces_segment_of_sigkilled_owner():
    spec = _spec("replace")
    _sigkilled_owner(spec)
    with Channel.create(spec):
        assert _segment_exists(spec)
    assert not _segment_exists(spec)


# ---- latency (printed, not asserted) ---------------------------------------------------------------------------------

def test_one_step_of_proposals_makes_the_round_trip_intact_and_in_order(capsys):
    """What is deterministic about the round trip: each reply answers its own block, with what was sent. The time
    is a figure printed beside it (a loaded host slows it; nothing asserts it)."""
    count, warmup = 400, 50
    tokens = np.arange(4, dtype=np.int64)
    logits = np.random.default_rng(1).standard_normal((4, 49152)).astype(np.float32)
    req_spec = _spec("lat_req", slots=4, payload_bytes=logits.nbytes + 256)
    rep_spec = _spec("lat_rep", slots=4, payload_bytes=0)
    with Channel.create(req_spec) as req, Channel.create(rep_spec) as rep:
        child = _start(_ack, req_spec.name, rep_spec.name, count)
        times, replies = [], []
        for i in range(count):
            tokens[0] = i                                   # every block differs from the one before
            t0 = time.perf_counter()
            req.send({"block": i}, {"tokens": tokens, "logits": logits}, timeout=10)
            with rep.recv(timeout=10) as reply:
                replies.append(reply.header)
            times.append(time.perf_counter() - t0)
        child.join(10)
        assert child.exitcode == 0
    expected = float(logits[:, ::97].sum()) + 6
    assert [r["block"] for r in replies] == list(range(count)) == [r["seq"] for r in replies]
    assert all(r["sum"] == expected + i for i, r in enumerate(replies))
    us = np.array(times[warmup:]) * 1e6
    with capsys.disabled():
        print(f"\nchannel round trip (4 int64 + 4x49152 float32 there, tiny ack back): median {np.median(us):.0f} us, "
              f"p90 {np.percentile(us, 90):.0f} us over {count - warmup} messages")


def _burst_and_exit(name: str, count: int) -> None:
    with Channel.attach(name) as out:
        for i in range(count):
            out.send({"i": i}, {"x": np.full(3, i, np.int64)})
    # the process exits at once: its socket closes with linger 0, possibly dropping queued wake-ups


def test_messages_sent_just_before_the_producer_exits_are_all_received():
    spec = _spec("burst", slots=64, payload_bytes=256)
    with Channel.create(spec) as inp:
        child = _start(_burst_and_exit, spec.name, 50)
        child.join(timeout=30)
        assert child.exitcode == 0
        got = []
        for _ in range(50):
            with inp.recv(timeout=5) as msg:
                got.append((msg.header["i"], int(msg.arrays["x"][0])))
        assert got == [(i, i) for i in range(50)]
        with pytest.raises(TimeoutError):
            inp.recv(timeout=0.05)


def test_depth_counts_waiting_messages_and_in_flight_counts_until_release():
    spec = _spec("depth", slots=4, payload_bytes=64)
    with Channel.create(spec) as owner, Channel.attach(spec.name, timeout=5) as producer:
        for i in range(3):
            producer.send({"i": i}, timeout=5)
        deadline = time.monotonic() + 5
        while owner.depth() < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert owner.depth() == 3 and producer.in_flight() == 3
        msg = owner.recv(timeout=5)
        assert owner.depth() == 2 and producer.in_flight() == 3     # received but still being worked on
        msg.release()
        assert producer.in_flight() == 2
        for _ in range(2):
            owner.recv(timeout=5).release()
        assert owner.depth() == 0 and producer.in_flight() == 0


# ---- what other local users leave in /dev/shm and the temp directory ---------------------------------------------

NOBODY = 65534


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def _plant(name: str, endpoint: str = "", uid: int | None = None, where: str = SHM_DIR) -> str:
    """A stale segment as a dead owner leaves it (dead pid, magic, `endpoint`), owned by `uid` (default: us)."""
    from pipeline import channel
    control = np.zeros(channel._CONTROL_BYTES // 8, "<u8")
    control[channel._W_PID], control[channel._W_MAGIC] = _dead_pid(), channel._MAGIC
    raw = endpoint.encode()
    control[channel._W_ENDPOINT_LEN] = len(raw)
    data = bytearray(control.tobytes())
    data[channel._ENDPOINT_AT:channel._ENDPOINT_AT + len(raw)] = raw
    path = os.path.join(where, name)
    with open(path, "wb") as f:
        f.write(bytes(data) + bytes(4096))
    os.chmod(path, 0o600)
    if uid is not None:
        os.chown(path, uid, uid)
    return path


def _socket_file(path: str) -> None:
    import socket
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(path)


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="planting another user's file needs root")


@needs_root
def test_cleanup_stale_skips_another_users_stale_segment_and_never_unlinks_it():
    name = _spec("foreign").segment_name
    path = _plant(name, uid=NOBODY)
    try:
        assert name not in cleanup_stale(PREFIX + "test_")
        assert os.path.exists(path)
    finally:
        os.unlink(path)


@needs_root
def test_a_segment_another_user_cannot_read_is_skipped_and_the_restart_goes_on(capsys):
    """Run as another user, cleanup_stale meets our 0600 segment: open raises PermissionError, which used to end the
    launcher instead of restarting it."""
    name = _spec("unreadable").segment_name
    path = _plant(name)
    os.setegid(NOBODY)
    os.seteuid(NOBODY)                                # this process, as another user, for one call
    try:
        removed = cleanup_stale(PREFIX + "test_")
    finally:
        os.seteuid(0)
        os.setegid(0)
    try:
        assert name not in removed and name in capsys.readouterr().err      # logged, skipped
        assert os.path.exists(path)
    finally:
        os.unlink(path)


def test_a_planted_header_endpoint_outside_the_ipc_directory_is_never_unlinked(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    name = _spec("planted").segment_name
    _plant(name, endpoint=f"ipc://{victim}")
    assert name in cleanup_stale(PREFIX + "test_")                     # the stale segment of ours goes
    assert victim.read_text() == "keep me"


def test_a_header_endpoint_through_a_symlinked_directory_is_not_followed():
    """A socket file with our prefix, reached through a link in the temp directory to a directory elsewhere: the
    name and prefix are right, the resolved directory is not ours. (The directory is a short one of its own: a
    socket's path has room for 107 bytes, which pytest's tmp_path can pass, e.g. under pytest-xdist's workers.)"""
    elsewhere = Path(tempfile.mkdtemp(prefix="rs-else-"))
    name = _spec("linkdir").segment_name
    target = elsewhere / f"{name}.ipc"
    link = os.path.join(tempfile.gettempdir(), f"ringspec_link_{uuid.uuid4().hex[:8]}")
    try:
        _socket_file(str(target))
        os.symlink(elsewhere, link)
        _plant(name, endpoint=f"ipc://{link}/{name}.ipc")
        assert name in cleanup_stale(PREFIX + "test_")
        assert target.exists()
    finally:
        if os.path.islink(link):
            os.unlink(link)
        shutil.rmtree(elsewhere)


def test_a_symlink_in_dev_shm_is_neither_followed_nor_unlinked(tmp_path):
    name = _spec("shmlink").segment_name
    stale = _plant("stale_segment", where=str(tmp_path))          # a stale header cleanup would act on
    link = os.path.join(SHM_DIR, name)
    os.symlink(stale, link)
    try:
        assert name not in cleanup_stale(PREFIX + "test_")
        assert os.path.islink(link) and os.path.exists(stale)
    finally:
        os.unlink(link)


@needs_root
def test_attach_refuses_a_segment_another_user_owns():
    spec = _spec("foreign_attach")
    with Channel.create(spec):
        os.chown(os.path.join(SHM_DIR, spec.segment_name), NOBODY, NOBODY)
        with pytest.raises(PermissionError, match="refusing to attach"):
            Channel.attach(spec.name, timeout=1)
