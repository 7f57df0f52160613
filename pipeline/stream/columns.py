"""Columns: a row's cells named by the header its log declared, or by the layout its format fixes.

Owns `Header` (a log's column names and separator), `header_of` (a W3C extended log's "#Fields: ..." line, a Zeek
log's "#fields<TAB>..." line), `cells` (a row's cells as `col:NAME` values, each with its span; a cell written "-" or
"(empty)" left out; a row of another width than its header has none), the NCSA common/combined access log's fixed
layout (read with no header: client, ident, user, time, method, path, protocol, status, bytes, referrer, agent), and
`meaning`: the words a column's name stands for, so an operator's "which source port" finds Zeek's `id.orig_p`.
Positional formats write no word beside a value; their header or their standard is what names it. The archive's
writer (pipeline/stream/archive.py) keeps a `Headers` over the lines it reads, so a row is named by the header in
force above it.

Which header line is taken (`Headers`): both formats write their header as a block of directive lines at the head of a
log (W3C: "#Version", "#Fields", "#Software", "#Start-Date", "#End-Date", "#Date", "#Remark", written at the start of
a log or after a restart; Zeek: "#separator" first, then "#set_separator", "#empty_field", "#unset_field", "#path",
"#open", "#fields", "#types"). So a "#Fields:" line is taken only inside a block (the "#" lines just before it, at most
`BLOCK`) holding a W3C directive only a log's writer starts one with (#Version, #Software, #Date, #Start-Date), a
"#fields" line only in a block that began with "#separator", and either only as the first line of its source; any
other header line (a lone "#Fields:" among rows: a line an attacker got into the stream) renames nothing and is
counted (`refused`). A row is named only when its cell count equals its header's. Never touches SQLite or a model.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from pipeline.stream.values import Value, stem

EMPTY = frozenset({"-", "(empty)", ""})        # a cell saying "no value" (W3C and NCSA "-", Zeek's "(empty)")
# What the parts of a column's name stand for; a part not listed stands for itself. Sources: the W3C Extended Log File
# Format (W3C Working Draft WD-logfile-960323, "Fields": prefix c client, s server, r remote, cs client to server, sc
# server to client, sr server to remote, rs remote to server); Zeek's log fields (docs.zeek.org, `conn_id`: id.orig_h
# and id.orig_p the connection's originator, the client, id.resp_h and id.resp_p its responder; `*_fuids` file
# unique ids; `*_len` lengths in bytes; `ts` the time); the NCSA log format (Apache httpd, mod_log_config: %h %l %u
# %t "%r" %>s %b "%{Referer}i" "%{User-agent}i").
PARTS = {
    "c": "client who", "s": "server", "r": "remote", "cs": "client sent send", "sc": "server sent send response return",
    "sr": "server sent send", "rs": "remote sent send",
    "orig": "client source originator local who", "resp": "server responder destination remote response",
    "h": "host ip address", "p": "port", "ip": "ip address", "port": "port",
    "src": "source client", "dst": "destination server", "dest": "destination server", "addr": "address",
    "proto": "protocol", "pid": "process id", "num": "number", "cnt": "count", "usr": "user", "dur": "duration",
    "uid": "uid id connection", "fuid": "file id", "fuids": "file id", "mime": "mime type", "types": "type",
    "len": "length size bytes big", "bytes": "bytes size big length", "ts": "time when timestamp",
    "date": "date day when", "time": "time when", "taken": "taken took duration long",
    "uri": "uri url path", "stem": "path file page", "query": "query string parameters",
    "path": "path url uri file page",
    "username": "user name who", "user": "user name who", "ident": "ident identity",
    "user_agent": "agent browser", "user-agent": "agent browser", "agent": "agent browser",
    "referer": "referrer referer", "referrer": "referrer referer", "method": "method verb",
    "host": "host header site name", "status": "status code", "code": "code status", "msg": "message reason",
    "version": "version protocol", "protocol": "protocol version", "sitename": "site name",
    "computername": "computer host name", "trans": "transaction", "depth": "depth",
}
NCSA = ("client", "ident", "user", "time", "method", "path", "protocol", "status", "bytes", "referrer", "user-agent")
_NCSA = re.compile(r'^(\S+) (\S+) (\S+) \[([^\]]+)\] "(\S+) (\S+)(?: (\S+))?" (\d{3}) (\d+|-)'
                   r'(?: "((?:[^"\\]|\\.)*)" "((?:[^"\\]|\\.)*)")?')
_PART = re.compile(r"[A-Za-z0-9]+")


@dataclass(frozen=True)
class Header:
    names: tuple[str, ...]
    sep: str                       # the cells' separator: " " (W3C), "\t" (Zeek), or a delimited file's
    quoted: bool = False           # a cell may be written in double quotes (CSV's rule: RFC 4180, "" inside)


def header_of(text: str) -> Header | None:
    """The column layout a header line declares, or None when `text` is not one."""
    if text.startswith("#Fields:"):
        return Header(tuple(text[8:].split()), " ")
    if text.startswith("#fields\t"):
        return Header(tuple(text.split("\t")[1:]), "\t")
    return None


_NAME = re.compile(r"[A-Za-z_][\w .()/#%\[\]-]{0,63}")
_DELIMITERS = ("\t", ";", ",", "|")
_DATUM = re.compile(r"\d:\d\d|^\d+$")        # a cell holding a time or a bare number: a row, not a name


def delimited_header(text: str) -> Header | None:
    """The columns a delimited file's first line names (CSV, TSV, semicolon or pipe separated): at least 3 cells,
    each a name (a letter or `_` first, no more than 64 characters, none of them a number or a time), under the first
    separator giving that; else None. Whether the line is a file's first is the caller's to know."""
    for sep in _DELIMITERS:
        parts = [text[a:b] for a, b in split_cells(text, sep, True)]
        if len(parts) >= 3 and all(_NAME.fullmatch(p.strip()) for p in parts) \
                and not any(_DATUM.search(p) for p in parts):
            return Header(tuple(p.strip() for p in parts), sep, True)
    return None


def split_cells(text: str, sep: str, quoted: bool = False) -> list[tuple[int, int]]:
    """Each cell's (start, end) in `text`; `quoted`: a cell opening with a double quote runs to its closing one (a
    doubled quote inside stays), its span inside the quotes."""
    out, at = [], 0
    while True:
        if quoted and text.startswith('"', at):
            end = at + 1
            while (end := text.find('"', end)) >= 0 and text.startswith('""', end):
                end += 2
            if end >= 0 and (end + 1 == len(text) or text.startswith(sep, end + 1)):
                out.append((at + 1, end))
                if end + 1 == len(text):
                    return out
                at = end + 1 + len(sep)
                continue
        nxt = text.find(sep, at)
        if nxt < 0:
            out.append((at, len(text)))
            return out
        out.append((at, nxt))
        at = nxt + len(sep)


BLOCK = 16                 # directive lines a header block holds at most (Zeek writes 8)
_W3C_HEAD = ("#Version:", "#Software:", "#Date:", "#Start-Date:")


class Headers:
    """The header in force as a log's lines are read in order (the rule: see the module's docstring)."""

    def __init__(self):
        self.header: Header | None = None
        self.block: list[str] = []        # the directive lines just read, oldest first, this one not included
        self.refused = 0                  # header lines not taken

    def take(self, text: str, first: bool = False) -> Header | None:
        """Read the next line (`first`: the first line of its source); the header in force for it."""
        if not text.startswith("#"):
            self.block = []
            return self.header
        found = header_of(text)
        if found is not None:
            block = self.block[-BLOCK:]
            if first or (any(d.startswith(_W3C_HEAD) for d in block) if found.sep == " "
                         else bool(block) and block[0].startswith("#separator")):
                self.header = found
            else:
                self.refused += 1
        self.block = [*self.block[-BLOCK:], text] if not first else [text]
        return self.header


def cells(text: str, header: Header | None) -> list[Value]:
    """The row's cells as `col:NAME` values (empty ones left out): by `header` when the row has its width, else by the
    NCSA layout when the row is an access log line, else none. A header or comment line ("#...") has none."""
    if text.startswith("#"):
        return []
    if header is not None:
        spans = split_cells(text, header.sep, header.quoted)
        if len(spans) == len(header.names) and tuple(text[a:b].strip() for a, b in spans) != header.names:
            return [Value(f"col:{name}", text[a:b], a, b) for name, (a, b) in zip(header.names, spans)
                    if text[a:b] not in EMPTY]
    if m := _NCSA.match(text):
        return [Value(f"col:{name}", m[i], m.start(i), m.end(i)) for i, name in enumerate(NCSA, start=1)
                if m[i] is not None and m[i] not in EMPTY]
    return []


def meaning(name: str) -> frozenset[str]:
    """The stemmed words a column's name stands for: its parts (split at every non-alphanumeric), each as `PARTS`
    reads it, two parts together first ("user_agent")."""
    parts = [p.casefold() for p in _PART.findall(name)]
    words, i = [], 0
    while i < len(parts):
        pair = f"{parts[i]}_{parts[i + 1]}" if i + 1 < len(parts) else ""
        if pair in PARTS:
            words += PARTS[pair].split()
            i += 2
            continue
        words += PARTS.get(parts[i], parts[i]).split()
        i += 1
    return frozenset(stem(w) for w in words)
