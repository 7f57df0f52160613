"""Tokenizer rebuilt from GGUF metadata (byte-level BPE through `tokenizers`), detokenizer and chat template.

Owns text <-> token ids for one model: plain-text encoding, decoding, streaming detokenization, chat rendering.
Never lets text become a control token: only the chat TEMPLATE emits control ids; log lines and message content are
tokenized as plain text whatever they contain (docs/design.md, "The stream cannot speak for the system").
"""
from __future__ import annotations

import codecs
import os
import re
import threading

import numpy as np
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Regex, models, pre_tokenizers
from tokenizers import Tokenizer as _BPETokenizer

from models.gguf import read_header

CONTROL, USER_DEFINED = 3, 4  # tokenizer.ggml.token_type values that plain text must never produce

# Split regexes of the HF tokenizer.json of each family; llama-bpe (Llama 3) differs from qwen2 only in \p{N}{1,3}.
_QWEN2_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
             r"|\s+(?!\S)|\s+")
_LLAMA3_RE = _QWEN2_RE.replace(r"|\p{N}|", r"|\p{N}{1,3}|")


def _pre_tokenizer(pre: str | None):
    """tokenizer.ggml.pre -> pre-tokenizer. smollm: each digit alone, then GPT-2's regex (as SmolLM's
    tokenizer.json); qwen2 / llama-bpe: their own regex, then bytes; gpt2 / default / missing: GPT-2's regex."""
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre == "smollm":
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    if pre in ("qwen2", "llama-bpe"):
        split = pre_tokenizers.Split(Regex(_QWEN2_RE if pre == "qwen2" else _LLAMA3_RE), behavior="isolated")
        return pre_tokenizers.Sequence([split, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    if pre in (None, "default", "gpt2"):
        return byte_level
    raise ValueError(f"tokenizer.ggml.pre {pre!r} is not supported (smollm, qwen2, llama-bpe, gpt2, default are)")


def _byte_of_char() -> dict[int, int]:
    """GPT-2's byte-level alphabet, inverted: code point of a vocab character -> the byte it stands for."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = [b for b in range(256) if b not in printable]
    return {**{b: b for b in printable}, **{256 + n: b for n, b in enumerate(others)}}


def read_tokenizer_metadata(path: str | os.PathLike) -> dict:
    """The `tokenizer.*` metadata of a GGUF, from its header alone (models/gguf.py's walk)."""
    return read_header(path, keep=lambda key: key.startswith("tokenizer.")).meta


_BUILT: dict[tuple, Tokenizer] = {}     # (path, mtime, size) -> its tokenizer, built once per process
_BUILT_LOCK = threading.Lock()


class Tokenizer:
    """Byte-level BPE tokenizer of one model, built from its GGUF `tokenizer.*` metadata (see `from_gguf`)."""

    def __init__(self, meta: dict):
        kind = meta.get("tokenizer.ggml.model")
        if kind != "gpt2":
            raise ValueError(f"tokenizer.ggml.model {kind!r} is not supported (only 'gpt2', byte-level BPE)")
        tokens: list[str] = list(meta["tokenizer.ggml.tokens"])
        types = np.asarray(meta.get("tokenizer.ggml.token_type", [1] * len(tokens)), dtype=np.int32)
        merges = [(m[:i], m[i + 1:]) for m in meta["tokenizer.ggml.merges"] for i in [m.index(" ", 1)]]
        # Control tokens stay out of the BPE's added tokens, so plain text can only ever reach them through merges.
        # No unk token either (SmolLM2's would be <|endoftext|>): a byte the vocab lacks is dropped, as llama.cpp does.
        self._bpe = _BPETokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, merges, fuse_unk=False))
        self._bpe.pre_tokenizer = _pre_tokenizer(meta.get("tokenizer.ggml.pre"))
        self._tokens = tokens
        self.control_ids = np.flatnonzero((types == CONTROL) | (types == USER_DEFINED)).astype(np.int32)
        self._control = {tokens[i]: int(i) for i in self.control_ids if tokens[i]}
        self._control_set = frozenset(self.control_ids.tolist())
        to_byte = _byte_of_char()
        self._bytes = [t.encode() if i in self._control_set else self._byte_level(t, to_byte)
                       for i, t in enumerate(tokens)]
        # Bytes encode() silently drops (SmolLM2 lacks 21, among them \x04 \x06 \x13 \x14 \x16 \x1d and 0xF1 0xF2).
        self.dropped_bytes = bytes(sorted(set(range(256)) - {b[0] for b in self._bytes if len(b) == 1}))
        self.eos_id: int | None = meta.get("tokenizer.ggml.eos_token_id")
        self.bos_id: int | None = meta.get("tokenizer.ggml.bos_token_id")
        self.add_bos_token = bool(meta.get("tokenizer.ggml.add_bos_token", False))
        im_end = self._control.get("<|im_end|>")
        self.stop_ids = frozenset(i for i in (self.eos_id, im_end) if i is not None)
        self.chat_template: str | None = meta.get("tokenizer.chat_template")
        self._template = _compile(self.chat_template) if self.chat_template else None
        longest_first = sorted(self._control, key=len, reverse=True)
        self._control_split = re.compile("(" + "|".join(map(re.escape, longest_first)) + ")") if longest_first else None

    @classmethod
    def from_gguf(cls, source) -> "Tokenizer":
        """From a GGUF path (header read directly, fast), a gguf.GGUFReader, or anything holding one as `.reader`.
        A path's tokenizer is built once per process and shared (about 27 MB of tables; never changed once built, so
        the streams' actors run as threads of one process share it)."""
        reader = getattr(source, "reader", source)
        if hasattr(reader, "fields"):
            return cls({k: f.contents() for k, f in reader.fields.items() if k.startswith("tokenizer.")})
        path = os.path.realpath(source)
        st = os.stat(path)
        key = (path, st.st_mtime_ns, st.st_size)
        with _BUILT_LOCK:
            if key not in _BUILT:
                _BUILT[key] = cls(read_tokenizer_metadata(path))
            return _BUILT[key]

    @staticmethod
    def _byte_level(token: str, to_byte: dict[int, int]) -> bytes:
        try:
            return token.translate(to_byte).encode("latin-1")
        except UnicodeEncodeError:  # not in the byte-level alphabet (a raw user-defined token): its own UTF-8
            return token.encode()

    @property
    def vocab_size(self) -> int:
        return len(self._tokens)

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes one token writes (a control token: its name)."""
        return self._bytes[token_id]

    def token_text(self, token_id: int) -> str:
        """Text of one token (a lone piece of a multi-byte character shows as U+FFFD)."""
        return self._bytes[token_id].decode("utf-8", "replace")

    def encode(self, text: str, add_bos: bool | None = None) -> np.ndarray:
        """Plain text -> int32 ids; control-token text inside it stays text. BOS only if add_bos (default: GGUF's)."""
        ids = self._bpe.encode(text, add_special_tokens=False).ids
        if (self.add_bos_token if add_bos is None else add_bos) and self.bos_id is not None:
            ids = [self.bos_id, *ids]
        return np.asarray(ids, dtype=np.int32)

    def decode(self, ids, skip_control: bool = False) -> str:
        skip = self._control_set if skip_control else ()
        return b"".join(self._bytes[i] for i in map(int, ids) if i not in skip).decode("utf-8", "replace")

    def chat_text(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        """The chat template rendered as a string (for display; `render_chat` gives the ids)."""
        if self._template is None:
            raise ValueError("this GGUF has no tokenizer.chat_template")
        bos, eos = (self._tokens[i] if i is not None else "" for i in (self.bos_id, self.eos_id))
        return self._template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                     bos_token=bos, eos_token=eos)

    def render_chat(self, messages: list[dict], add_generation_prompt: bool = True) -> np.ndarray:
        """Chat -> int32 ids: control tokens written by the template become control ids, message content is plain text.

        Renders with each string content swapped for a sentinel, splits at the template's control-token text, puts the
        contents back and encodes each piece as plain text (what splitting specials first gives for benign content).
        Only `content` is data: roles and other fields are the caller's, and their control-token text stays control.
        """
        sentinels, masked = {}, []
        for n, m in enumerate(messages):
            if isinstance(m.get("content"), str):
                sentinels[f"\ue000{n}\ue001"] = m["content"]  # private-use code points: no template writes them
                m = {**m, "content": f"\ue000{n}\ue001"}
            masked.append(m)
        text = self.chat_text(masked, add_generation_prompt)
        pieces = self._control_split.split(text) if self._control_split else [text]
        restore = re.compile("|".join(map(re.escape, sentinels))) if sentinels else None
        ids: list[int] = []
        for k, piece in enumerate(pieces):
            if k % 2:  # re.split puts the captured control tokens at odd indices
                ids.append(self._control[piece])
            elif piece:
                plain = restore.sub(lambda m: sentinels[m.group()], piece) if restore else piece
                ids.extend(self.encode(plain, add_bos=False).tolist())
        if self.add_bos_token and self.bos_id is not None and ids[:1] != [self.bos_id]:
            ids.insert(0, self.bos_id)
        return np.asarray(ids, dtype=np.int32)


def _raise_exception(message: str):
    raise ValueError(f"chat template: {message}")


def _compile(template: str):
    """Sandboxed, with the settings and helpers HF chat templates are written for."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.globals["raise_exception"] = _raise_exception
    return env.from_string(template)


class StreamDecoder:
    """Incremental detokenizer: `push(id)` returns the text that token completes, holding back an incomplete UTF-8
    sequence until the bytes that finish it arrive; `flush()` ends the stream. Concatenated output == decode(ids)."""

    def __init__(self, tokenizer: Tokenizer, skip_control: bool = False):
        self._bytes = tokenizer._bytes
        self._skip = tokenizer._control_set if skip_control else frozenset()
        self._utf8 = codecs.getincrementaldecoder("utf-8")("replace")

    def push(self, token_id: int) -> str:
        return "" if token_id in self._skip else self._utf8.decode(self._bytes[token_id])

    def flush(self) -> str:
        text = self._utf8.decode(b"", final=True)
        self._utf8.reset()
        return text
