"""Ingest actor: owns the source, the parser, the renderer and the tokenizer.

Receives nothing; emits one message per record to the cache owner (header: offset, time, tags, text; array: token
ids), then an "eof" carrying its counts and figures. Bounded: when the owner's channel stays full the record is
dropped and counted, never buffered without limit. Never touches a model or the cache.
"""
from __future__ import annotations

import numpy as np

from actors.common import Figures, attach_when_ready, pin
from pipeline.records import format_of


def run(out_name: str, source_args: dict, gguf: str, cpus: str, stop, drop_after_s: float = 5.0) -> None:
    from models.tokenizer import Tokenizer
    from pipeline import sources
    from pipeline.assemble import resolve_gguf

    pin(cpus)
    figures = Figures("ingest")
    tok = Tokenizer.from_gguf(resolve_gguf(gguf))
    src = sources.replay(source_args["path"], source_args.get("speed", 0.0), fmt=source_args.get("format"),
                         stop=stop)
    fmt = source_args.get("format") or format_of(source_args["path"])
    dropped = sent = 0
    limit = source_args.get("max_lines") or 0
    with attach_when_ready(out_name, stop) as out:
        for i, rec in enumerate(sources.parse(fmt, src)):
            if stop.is_set() or (limit and i >= limit):
                break
            with figures.busy():
                ids = tok.encode(rec.text + "\n").astype(np.int32)
                try:
                    out.send({"kind": "line", "offset": rec.offset, "time": rec.time, "tags": list(rec.tags),
                              "text": rec.text}, {"ids": ids}, timeout=drop_after_s)
                    sent += 1
                except TimeoutError:
                    dropped += 1
        st = src.stats
        out.send({"kind": "eof", "sent": sent, "dropped_full": dropped, "invalid_utf8": st.invalid_utf8,
                  "nul_bytes": st.nul_bytes, "oversized": st.oversized, "lines": st.lines,
                  "figures": [figures.snapshot()]}, timeout=60.0)
