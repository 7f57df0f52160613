"""Stream records and the one text form the model sees.

Owns parsing of a captured log (plain lines, TEP alarm CSV, JSON lines) into `Record`s and `render`, the single
renderer every consumer uses (replay, scoring, benchmarks). Never tokenizes and never touches a model.

Rendered form, one line per record:  ``HH:MM:SS TAG TYPE DESCRIPTION`` for alarm CSV rows, ``HH:MM:SS key=value ...``
for JSON lines with a timestamp, and the line itself (control characters replaced) for plain text.
"""
from __future__ import annotations

import csv
import io
import itertools
import json
import re
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Record:
    offset: int            # index of the record in its source
    time: str              # as written by the source ("" when it has none)
    text: str              # the rendered line, newline excluded
    tags: tuple[str, ...] = ()


def _clean(text: str) -> str:
    return "".join(ch if ch.isprintable() or ch == "\t" else " " for ch in text).strip()


def _clock(timestamp: str) -> str:
    """'2024-05-01 01:32:20.000000000' -> '01:32:20' (unknown shapes pass through)."""
    parts = timestamp.strip().split(" ")
    return parts[-1].split(".")[0] if len(parts) == 2 else timestamp.strip()


def parse_csv(text: str) -> list[Record]:
    """Alarm CSV rows. A lone carriage return is a space (the csv module refuses one in an unquoted field); a row with
    fewer fields than the header keeps its text; a row the csv module cannot read (a field over its 128 KB limit)
    becomes a record saying so. Blank rows are skipped; no other line is lost."""
    rows = csv.reader(io.StringIO(text.replace("\r\n", "\n").replace("\r", " ")))
    try:
        header = [h.strip().lower() for h in next(rows, [])]
    except csv.Error as exc:
        raise ValueError(f"CSV header unreadable: {exc}") from None
    col = {name: i for i, name in enumerate(header)}
    if not {"timestamp", "tag", "type", "description"} <= col.keys():
        raise ValueError(f"CSV header {header} lacks timestamp, tag, type and description columns")
    out = []
    for i in itertools.count():                      # next() by hand: the reader goes on after a csv.Error
        try:
            row = next(rows)
        except StopIteration:
            return out
        except csv.Error as exc:
            out.append(Record(i, "", f"unreadable CSV row ({exc})"))
            continue
        if not any(cell.strip() for cell in row):
            continue
        if len(row) < len(header):                   # a row cut short: its text, not a lost line
            out.append(Record(i, "", _clean(",".join(row))))
            continue
        ts, tag, kind, desc = (_clean(row[col[k]]) for k in ("timestamp", "tag", "type", "description"))
        out.append(Record(i, ts, f"{_clock(ts)} {tag} {kind} {desc}", (tag,)))


def parse_jsonl(text: str) -> list[Record]:
    out = []
    for i, line in enumerate(text.splitlines()):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            out.append(Record(i, "", _clean(line)))
            continue
        if not isinstance(obj, dict):
            out.append(Record(i, "", _clean(str(obj))))
            continue
        ts = str(obj.pop("timestamp", obj.pop("time", "")))
        body = " ".join(f"{k}={_fmt(v)}" for k, v in obj.items())
        out.append(Record(i, ts, _clean(f"{_clock(ts)} {body}" if ts else body), tuple(
            str(obj[k]) for k in ("tag",) if k in obj)))
    return out


def _fmt(value) -> str:
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def parse_plain(text: str) -> list[Record]:
    return [Record(i, "", _clean(line)) for i, line in enumerate(text.splitlines()) if line.strip()]


PARSERS = {"csv": parse_csv, "jsonl": parse_jsonl, "plain": parse_plain}


def format_of(path: str | Path) -> str:
    """The log format a file name implies: .csv, .jsonl, anything else plain."""
    return {".csv": "csv", ".jsonl": "jsonl"}.get(Path(path).suffix, "plain")


def log_files(path: str | Path) -> list[Path]:
    """A file, or a directory's files in natural order (filter_2 before filter_10): one stream, read in that order."""
    path = Path(path)
    if not path.is_dir():
        return [path]
    key = lambda p: [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", p.name)]
    files = sorted((p for p in path.iterdir() if p.is_file() and not p.name.startswith(".")), key=key)
    if not files:
        raise ValueError(f"{path}: the directory holds no log files")
    return files


def read_log(path: str | Path, fmt: str | None = None) -> list[Record]:
    """The records of a log file, or of a directory's files concatenated in natural order (see `log_files`)."""
    files = log_files(path)
    fmt = fmt or format_of(files[0])
    return [r for f in files for r in PARSERS[fmt](f.read_bytes().decode("utf-8", errors="replace"))]


def render(records) -> str:
    return "".join(r.text + "\n" for r in records)
