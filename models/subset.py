"""Drafts cut from a model: a GGUF holding a subset of its transformer blocks, everything else shared byte for byte.

Owns writing such a file, copying GGUF metadata fields as stored (`copy_field`, also used by the distilled draft's
export) and parsing the block lists people type ("0-5,12-29"). Never converts or runs a model.
"""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
from gguf import GGUFReader, GGUFValueType, GGUFWriter


def parse_blocks(text: str) -> list[int]:
    """"0-5,12-29" -> [0, ..., 5, 12, ..., 29]; ValueError on anything else."""
    out: list[int] = []
    for part in text.replace(" ", "").split(","):
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if not m or int(m[2] or m[1]) < int(m[1]):
            raise ValueError(f"bad block list {text!r}: use numbers and ranges like 0-5,12-29")
        out.extend(range(int(m[1]), int(m[2] or m[1]) + 1))
    if len(set(out)) != len(out):
        raise ValueError(f"bad block list {text!r}: a block appears twice")
    return sorted(out)


def copy_field(writer: GGUFWriter, key: str, field) -> None:
    """Write a metadata field read by GGUFReader to `writer` as stored (strings as bytes, arrays with their type)."""
    main = field.types[0]
    if main == GGUFValueType.STRING:
        writer.add_key_value(key, bytes(field.parts[-1]), main)
    elif main == GGUFValueType.ARRAY:
        sub = field.types[-1]
        if sub == GGUFValueType.ARRAY:
            raise ValueError(f"{key}: nested arrays are not supported")
        value = [bytes(field.parts[i]) for i in field.data] if sub == GGUFValueType.STRING else field.contents()
        writer.add_key_value(key, value, main, sub_type=sub)
    else:
        writer.add_key_value(key, field.contents(), main)


def layer_subset(src_gguf, dst_gguf, keep) -> Path:
    """Copy src_gguf to dst_gguf keeping blocks 0..keep-1 (or the listed blocks, renumbered in order): tensors byte
    for byte in their own quant types, every metadata key copied as stored except {arch}.block_count.

    The result shares the tokenizer, embeddings, final norm and head: a self-speculative draft cut from the target."""
    reader = GGUFReader(str(src_gguf))
    arch = reader.fields["general.architecture"].contents()
    n_blocks = int(reader.fields[f"{arch}.block_count"].contents())
    blocks = list(range(keep)) if isinstance(keep, int) else sorted(keep)
    if not blocks or blocks[0] < 0 or blocks[-1] >= n_blocks or len(set(blocks)) != len(blocks):
        outside = [b for b in blocks if not 0 <= b < n_blocks]
        raise ValueError(f"{src_gguf} has blocks 0..{n_blocks - 1}; "
                         + (f"block {outside[0]} is not one of them" if outside else "the block list is empty or "
                            "repeats a block"))
    renumber = {old: new for new, old in enumerate(blocks)}
    keep = len(blocks)
    writer = GGUFWriter(str(dst_gguf), arch)
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue   # header fields and the architecture are written by GGUFWriter itself
        if key == f"{arch}.block_count":
            writer.add_key_value(key, keep, field.types[0])
        else:
            copy_field(writer, key, field)
    if "general.alignment" in reader.fields:
        writer.data_alignment = int(reader.fields["general.alignment"].contents())
    for t in reader.tensors:
        name = t.name
        if name.startswith("blk."):
            _, index, rest = name.split(".", 2)
            if int(index) not in renumber:
                continue
            name = f"blk.{renumber[int(index)]}.{rest}"
        writer.add_tensor(name, np.asarray(t.data), raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return Path(dst_gguf)
