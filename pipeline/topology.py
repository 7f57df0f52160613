"""The pipeline's channels: which actor creates each one (its consumer) and how big it is, from the config.

Owns the geometry the launcher builds and the memory plan counts, in one place, so the plan is what runs. Never
creates a channel or starts anything.

    ingest --lines--> cache owner --events--> output          (serve: output --asks--> cache owner)
    cache owner <-> target: to_target, from_target;  cache owner <-> draft: to_draft, from_draft
"""
from __future__ import annotations

from pipeline.channel import ChannelSpec

ROLES = ("ingest", "cache_owner", "target", "draft", "output")     # the actors of a pipeline (a node group's)
CREATORS = {"lines": "cache_owner", "events": "output", "asks": "cache_owner", "to_target": "target",
            "from_target": "cache_owner", "to_draft": "draft", "from_draft": "cache_owner"}


def actor_name(role: str, node: str = "") -> str:
    """The name of a node group's actor (one of each role serves all its streams): `role@node` when the streams are
    on several nodes, else `role`. The launcher, the memory plan and /metrics all name it so."""
    return f"{role}{'@' + node if node else ''}"


def per_stream_file(path: str, stream: str) -> str:
    """A file a stream keeps to itself (its journal, its archive): `F.EXT` becomes `F.stream.EXT`; one stream keeps
    `path`."""
    if not stream:
        return path
    stem, dot, ext = path.rpartition(".")
    return f"{stem}.{stream}.{ext}" if dot and "/" not in ext else f"{path}.{stream}"


def channels(cfg, spec, vocab: int, tag: str) -> dict[str, ChannelSpec]:
    """Every channel of a pipeline run with `cfg` (asks only when serving), named `{tag}_{name}`."""
    out = {"lines": channel(tag, "lines", 64, 64 << 10, header_bytes=16 << 10),
           "events": channel(tag, "events", 64, 64 << 10, header_bytes=16 << 10)}
    if cfg.serve.enabled:
        out["asks"] = channel(tag, "asks", 64, cfg.serve.max_prompt_tokens * 4 + (4 << 10))
    return out | model_links(cfg, spec, vocab, tag)


def model_links(cfg, spec, vocab: int, tag: str) -> dict[str, ChannelSpec]:
    """The four channels between the sequence's owner and the two model actors: the owner creates from_target and
    from_draft, the actors create to_target and to_draft."""
    rows = cfg.model.max_rows
    mask_bytes = rows * (spec.pool_slots + 64 + rows) * 4
    q_bytes = cfg.draft.length * vocab * 8 if cfg.draft.uses_model and cfg.sampling.temperature > 0 else 0
    return {"to_target": channel(tag, "to_target", 8, mask_bytes + q_bytes + (16 << 10)),
            "from_target": channel(tag, "from_target", 16, 1 << 10),
            "to_draft": channel(tag, "to_draft", 256, 1 << 10, header_bytes=1 << 10),   # small headers, many
            "from_draft": channel(tag, "from_draft", 8, q_bytes + (4 << 10))}


def channel(tag: str, name: str, slots: int, payload: int, header_bytes: int = 4 << 10) -> ChannelSpec:
    return ChannelSpec(f"{tag}_{name}", slots=slots, payload_bytes=payload, header_bytes=header_bytes)
