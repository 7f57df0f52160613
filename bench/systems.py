"""The systems the speed bench compares: ringspec engines (serial or pipelined) with their drafts, and llama.cpp with
or without its prompt-lookup draft; what profile each ringspec system runs with.

Owns the list and the profile keys each system sets. Never runs one.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from models import registry
from pipeline import config


@dataclass(frozen=True)
class System:
    """A way of generating: a ringspec engine with a proposer, or llama.cpp with or without its lookup draft."""
    name: str
    kind: str                     # "ringspec" (one process) | "pipelined" (target and draft actors) | "llama_cpp"
    draft: str = "none"           # ringspec: none | suffix | model | hybrid; llama_cpp: none | lookup | model
    draft_gguf: str = ""
    draft_len: int = 6
    min_confidence: float = 0.0   # a draft model's chain stops below this top probability
    adaptive: bool = False        # ringspec: proposals per verify chosen online, at most draft_len
    end_at_line: bool = False     # ringspec: a block ends after a newline-carrying proposal
    siblings: int = 0             # ringspec: token trees with this many other first tokens (the tree graph)
    batch_invariant: bool = True  # ringspec: the runner's one-row padding rule (off: the "_unpadded" twins)
    kernel: str = ""              # ringspec: the linears' kernel ("native": the "_native" twins); "": the profile's

    @property
    def exact_reference(self) -> str:
        """The system whose tokens this one's must equal: target-only under the same padding rule and kernel."""
        return ("target_only" if self.batch_invariant else "target_only_unpadded") + \
            (f"_{self.kernel}" if self.kernel else "")


def select(chosen: list[System], only) -> list[System]:
    """The systems named in `only` plus target_only (every system is checked against it); all when `only` is empty."""
    if not only:
        return chosen
    unknown = set(only) - {s.name for s in chosen}
    if unknown:
        raise ValueError(f"unknown bench system(s) {', '.join(sorted(unknown))}: choose from "
                         f"{', '.join(s.name for s in chosen)}")
    twin = (lambda s: s.kernel and s.name.removesuffix(f"_{s.kernel}") in only)   # a named system's kernel twin
    picked = [s for s in chosen if s.name in only or twin(s)]
    references = {"target_only", "target_only_unpadded"} | {s.exact_reference for s in picked}
    return [s for s in chosen if s in picked or s.name in references]


def systems(draft_gguf: str = "", llama_cpp: bool = True, unpadded: bool = False, native: bool = False) -> list[System]:
    """Every system; unpadded: each ringspec system also without the one-row padding rule (name + "_unpadded"),
    to measure what the rule costs; native: each (padded) ringspec system also on the native kernel (name +
    "_native", models/native.py), side by side with the profile's."""
    out = _systems(draft_gguf, llama_cpp)
    ours = [s for s in out if s.kind != "llama_cpp"]
    if unpadded:
        out += [dataclasses.replace(s, name=f"{s.name}_unpadded", batch_invariant=False) for s in ours]
    if native:
        out += [dataclasses.replace(s, name=f"{s.name}_native", kernel="native") for s in ours]
    return out


def _systems(draft_gguf: str, llama_cpp: bool) -> list[System]:
    out = [System("target_only", "ringspec"), System("suffix_serial", "ringspec", "suffix"),
           System("pipelined", "pipelined", "suffix"),
           System("pipelined_tree", "pipelined", "suffix", siblings=2),
           System("pipelined_adaptive", "pipelined", "suffix", adaptive=True),
           System("adaptive_serial", "ringspec", "suffix", adaptive=True),
           System("lines_serial", "ringspec", "suffix", end_at_line=True),
           System("tree_serial", "ringspec", "suffix", siblings=2)]
    if draft_gguf:
        out += [System("draft_serial", "ringspec", "model", draft_gguf, 3),
                System("hybrid_serial", "ringspec", "hybrid", draft_gguf, 6),
                System("adaptive_hybrid_serial", "ringspec", "hybrid", draft_gguf, 8, adaptive=True),
                System("hybrid_tree_serial", "ringspec", "hybrid", draft_gguf, 6, siblings=2),
                System("pipelined_hybrid", "pipelined", "hybrid", draft_gguf, 6),
                System("pipelined_model", "pipelined", "model", draft_gguf, 3)]
    if llama_cpp:
        out += [System("llama_cpp_plain", "llama_cpp"), System("llama_cpp_lookup", "llama_cpp", "lookup")]
        if draft_gguf in registry.MODELS:   # llama.cpp speculative, the same draft GGUF (a registry model: the distilled
            # draft keeps 4,096 of the vocabulary, a head llama.cpp cannot load)
            out.append(System("llama_cpp_speculative", "llama_cpp", "model", draft_gguf, 3))
    return out


def load(profile, keys: dict | None = None):
    """A worker's profile: `profile` is the path (None: the defaults) or (path, the keys the bench's command line set
    over it, such as --model), with `keys` over both."""
    path, given = profile if isinstance(profile, tuple) else (profile, {})
    return config.load(path, {**given, **(keys or {})})


def settings(system: System, threads: int, window: int) -> dict:
    """The profile keys a ringspec system sets (over the defaults): its draft, threads, window and padding rule. A
    draft model runs on one thread: a draft of a few MB on two threads spins against the target, 2x slower."""
    out = {"model.threads": threads, "model.batch_invariant": system.batch_invariant, "cache.window": window,
           "draft.kind": system.draft, "draft.length": system.draft_len, "draft.threads": 1,
           "draft.min_confidence": system.min_confidence, "draft.adaptive": system.adaptive,
           "draft.end_at_line": system.end_at_line, "draft.siblings": system.siblings,
           "actors.launcher": "serial" if system.kind == "ringspec" else "local"}
    if system.kernel:
        out["model.kernel"] = system.kernel
    return {**out, "draft.model": system.draft_gguf} if system.draft_gguf else out
