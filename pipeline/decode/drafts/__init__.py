"""Drafts, one per module, behind one interface (`base.py`: `Proposer`, and the block it proposes, `Proposed`): none
(`none.py`), the stream proposer (`suffix.py`), the draft model (`model.py`), the stream or the model by match
(`hybrid.py`), and a token tree over any of them (`tree.py`).

Owns each draft's private state (the stream proposer's suffix index; the draft model's own KV pool and ring index).
Never touches the target's cache: the engine tells a draft what was committed, and the draft rolls itself back.
"""
from pipeline.decode.drafts.base import Proposed, Proposer
from pipeline.decode.drafts.hybrid import HybridDraft
from pipeline.decode.drafts.model import ModelDraft, speaks
from pipeline.decode.drafts.none import NoDraft
from pipeline.decode.drafts.suffix import SuffixDraft
from pipeline.decode.drafts.tree import TreeDraft

__all__ = ["HybridDraft", "ModelDraft", "NoDraft", "Proposed", "Proposer", "SuffixDraft", "TreeDraft", "speaks"]
