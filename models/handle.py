"""A model, named once: what a profile's model name (`model.gguf`, `draft.model`) stands for in this process.

Owns the one object the launcher, the actors and the engine hold for a model: its name, its GGUF file, its converted
directory, its card and its tokenizer (the chat template with it), each found on first use and kept. `Model.of(name)`
gives the same handle for the same name and file in one process; a handle sent to another process (an actor's
arguments, a Ray node's) travels as its name and is resolved there once, against that machine's own cache. `of`
resolves the name (a registry model fetched on first use); nothing converts or reads the model before a property
asks, and a profile is checked without making a handle at all. Never keeps a handle for a file that has since been
replaced (a name whose file changed is resolved again).
"""
from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from .convert import load_card
from .registry import converted_dir, resolve_gguf
from .tokenizer import Tokenizer


@dataclass(frozen=True, eq=False)
class Model:
    name: str                                    # as the profile gives it: "default", a registry name, a path
    path: Path = field(repr=False)               # its GGUF, resolved (`resolve_gguf`: fetched on first use)
    file: tuple = field(repr=False)              # (inode, size, mtime) of that file when it was resolved

    @classmethod
    def of(cls, name: str | os.PathLike) -> "Model":
        """The handle for `name` in this process: the name is resolved once, and again only if its file changed."""
        key = (str(name), os.getcwd())           # a relative path names another file from another directory
        with _LOCK:
            known = _HANDLES.get(key)
        if known is not None and _identity(known.path) == known.file:
            return known
        path = resolve_gguf(name).absolute()
        model = cls(str(name), path, _identity(path))
        with _LOCK:                              # two threads resolving it at once keep one handle
            current = _HANDLES.get(key)
            if current is None or current.file != model.file:
                _HANDLES[key] = current = model
            return current

    @property
    def gguf(self) -> Path:
        return self.path

    @cached_property
    def dir(self) -> Path:
        """The converted directory (ONNX graphs, weights, card): converted on first use, with progress."""
        return converted_dir(self.path)

    @cached_property
    def card(self) -> dict:
        """The model card: architecture, shapes, quantization (models/convert.py)."""
        return load_card(self.dir)

    @property
    def config(self) -> dict:
        """The card's architecture: layers, heads, widths, vocabulary, context length."""
        return self.card["config"]

    @property
    def tokenizer(self) -> Tokenizer:
        """Its tokenizer and chat template (built once per process per file: models/tokenizer.py)."""
        return Tokenizer.from_gguf(self.path)

    def __reduce__(self):
        return _of, (self.name,)                 # another process resolves the name for itself


def _of(name: str) -> Model:
    """What a handle unpickles through: `Model.of` as a module-level function (cloudpickle, which Ray uses, pickles a
    bound classmethod by value, with this module's lock)."""
    return Model.of(name)


def _identity(path: Path) -> tuple | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


_HANDLES: dict[tuple, Model] = {}                # (name, working directory) -> its handle
_LOCK = threading.Lock()
