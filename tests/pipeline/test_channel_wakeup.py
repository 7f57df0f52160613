"""The channels' wake-up sockets (pipeline/channel.py) carry queues and a frame cap sized to their protocol (an
8-byte note per slot, a one-byte credit per wait), read back from the sockets themselves; a stray ipc peer's large
frame cuts that peer off and the channel goes on."""
from __future__ import annotations

import uuid

import numpy as np
import zmq

from pipeline.channel import WAKE_MAX_BYTES, Channel, ChannelSpec


def test_both_ends_wake_up_sockets_cap_their_frames_and_queues_and_a_large_frame_changes_nothing():
    spec = ChannelSpec(f"test_wake_{uuid.uuid4().hex[:8]}", slots=8, payload_bytes=64)
    with Channel.create(spec) as owner, Channel.attach(spec.name) as peer:
        for end in (owner, peer):
            sock = end._sock
            assert sock.getsockopt(zmq.MAXMSGSIZE) == WAKE_MAX_BYTES
            assert sock.getsockopt(zmq.RCVHWM) == sock.getsockopt(zmq.SNDHWM) == 2 * spec.slots + 16
        stray = zmq.Context.instance().socket(zmq.PAIR)          # a frame over the cap: zmq cuts that peer off
        stray.setsockopt(zmq.LINGER, 0)
        stray.connect(owner.endpoint)
        stray.send(bytes(1 << 20), zmq.NOBLOCK) if stray.poll(0, zmq.POLLOUT) else None
        stray.close()
        peer.send({"n": 1}, {"a": np.arange(4, dtype=np.int32)}, timeout=30.0)
        with owner.recv(timeout=30.0) as got:
            assert got.header["n"] == 1 and got.arrays["a"].tolist() == [0, 1, 2, 3]
