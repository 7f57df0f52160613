"""Output actor: owns stdout, the append-only JSONL journal and the zmq PUB socket.

Receives events from the cache owner; detokenizes assessments; writes each event once to every sink. Never touches a
model or the cache.
"""
from __future__ import annotations

import json
import sys
import time

from pipeline.channel import Channel, ChannelSpec


def run(in_spec: ChannelSpec, gguf: str, journal: str | None, pub: str | None, quiet_lines: bool, stop) -> None:
    import zmq

    from models.tokenizer import Tokenizer
    from pipeline.assemble import resolve_gguf

    tok = Tokenizer.from_gguf(resolve_gguf(gguf))
    stops = set(tok.stop_ids)
    sock = None
    if pub:
        sock = zmq.Context.instance().socket(zmq.PUB)
        sock.setsockopt(zmq.LINGER, 0)
        sock.bind(pub)
    log = open(journal, "a", encoding="utf-8") if journal else None
    try:
        with Channel.create(in_spec) as inp:
            while not stop.is_set():
                try:
                    msg = inp.recv(timeout=0.2)
                except TimeoutError:
                    continue
                with msg:
                    event = dict(msg.header)
                    if "ids" in msg.arrays:
                        event["text"] = tok.decode([int(t) for t in msg.arrays["ids"] if int(t) not in stops]).strip()
                event["t"] = time.time()
                _emit(event, quiet_lines)
                if log and event["kind"] != "line":
                    log.write(json.dumps(event) + "\n")
                    log.flush()
                if sock is not None:
                    sock.send_multipart([event["kind"].encode(), json.dumps(event).encode()])
                if event["kind"] == "eof":
                    return
    finally:
        if log:
            log.close()
        if sock is not None:
            sock.close()


def _emit(event: dict, quiet_lines: bool) -> None:
    if event["kind"] == "line" and not quiet_lines:
        print(f"  {event['text']}", flush=True)
    elif event["kind"] == "assessment":
        st = event["stats"]
        text = event["text"].replace("\n", "\n   ")
        print(f"\n>> [after line {event['lines']}, bytes {event['offsets'][0]}-{event['offsets'][1]}] {text}\n"
              f"   ({st['generated']} tokens, {st['tokens_per_s']:.0f} tok/s, {event['latency_ms']:.0f} ms, "
              f"{st['accepted_per_verify']:.2f} tokens/verify)\n", flush=True)
    elif event["kind"] == "eof":
        print(f"end of stream: {event['sent']} records, dropped {event['dropped_full']} (queue full), "
              f"{event['invalid_utf8']} invalid UTF-8, {event['nul_bytes']} with NUL, {event['oversized']} "
              f"oversized", file=sys.stderr, flush=True)
