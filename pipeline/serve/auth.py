"""Who may ask, and as whom: the operators' API keys and the HTTP requests' origin.

Owns the key table (name -> key) read once at start-up from `serve.api_key` (the flag, or RINGSPEC_API_KEY) and
`serve.api_keys_file` (one `NAME KEY` per line, one per operator), the constant-time match of a presented key, and
the Host / Origin allow-list that keeps a loopback server from answering other sites' pages (DNS rebinding, a
cross-site POST). A key's NAME is the fair queue's identity: an operator cannot take another's turn by naming
themselves in a request field. Never reads a request body and never touches a socket.
"""
from __future__ import annotations

import hmac
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

ENV_KEY = "RINGSPEC_API_KEY"
SINGLE = "operator"                              # the name of the one key of serve.api_key
MIN_KEY_CHARS = 8
_NAME = re.compile(r"[A-Za-z0-9_.@-]{1,64}")
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
WILDCARDS = ("0.0.0.0", "::", "")


class KeysError(ValueError):
    """A key file or key that cannot be used; the message names the file and line."""


@dataclass(frozen=True)
class Keys:
    """The operators' keys; empty = no key asked for (a loopback server)."""
    table: tuple[tuple[str, bytes], ...] = ()

    @property
    def required(self) -> bool:
        return bool(self.table)

    def identify(self, presented: str) -> str | None:
        """The name of the operator whose key this is, or None. Every key is compared, in constant time each, so
        the time taken says nothing about which key or how many characters matched."""
        given, found = presented.encode(), None
        for name, key in self.table:
            if hmac.compare_digest(given, key) and found is None:
                found = name
        return found


def load_keys(api_key: str, keys_file: str) -> Keys:
    """The key table from serve.api_key (named "operator") and serve.api_keys_file; KeysError when unusable."""
    table: dict[str, str] = {}
    if api_key:
        if len(api_key) < MIN_KEY_CHARS:
            raise KeysError(f"serve.api_key has {len(api_key)} characters; use at least {MIN_KEY_CHARS}")
        table[SINGLE] = api_key
    if keys_file:
        table.update(_read_file(Path(keys_file), taken=set(table.values())))
    return Keys(tuple((name, key.encode()) for name, key in table.items()))


def _read_file(path: Path, taken: set[str]) -> dict[str, str]:
    try:
        mode = path.stat().st_mode
        # refused, not warned about: a key another user could read is already theirs, and a warning scrolls by
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise KeysError(f"serve.api_keys_file {path}: group or other users may access it (mode "
                            f"{stat.S_IMODE(mode):o}); run `chmod 600 {path}`")
        text = path.read_text()
    except OSError as exc:
        raise KeysError(f"serve.api_keys_file {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise KeysError(f"serve.api_keys_file {path}: not UTF-8 text") from None
    table: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split()
        where = f"serve.api_keys_file {path}, line {number}"
        if len(parts) != 2 or not _NAME.fullmatch(parts[0]):
            raise KeysError(f"{where}: expected `NAME KEY` (NAME of letters, digits, _.@-), got {len(parts)} fields")
        name, key = parts
        if len(key) < MIN_KEY_CHARS:
            raise KeysError(f"{where}: the key of {name} has {len(key)} characters; use at least {MIN_KEY_CHARS}")
        if name in table:
            raise KeysError(f"{where}: {name} is named twice")
        if key in taken or key in table.values():
            raise KeysError(f"{where}: the key of {name} is another operator's too; give each operator their own")
        table[name] = key
    if not table:
        raise KeysError(f"serve.api_keys_file {path}: no `NAME KEY` line")
    return table


def env_key() -> str | None:
    """RINGSPEC_API_KEY: a key given without putting it on a command line, where /proc/*/cmdline shows it."""
    return os.environ.get(ENV_KEY) or None


def allowed_hosts(setting: str, bind_host: str) -> frozenset[str] | None:
    """The Host names this server answers to (None = any). "" means the bind address, localhost and the loopback
    addresses; a wildcard bind (0.0.0.0, ::), which needs a key, answers any name it is reached by."""
    names = [h.strip().lower().strip("[]") for h in setting.split(",") if h.strip()]
    if "*" in names or (not names and bind_host.strip("[]") in WILDCARDS):
        return None
    return frozenset(names or (bind_host.strip("[]").lower(), *LOOPBACK_NAMES))


def host_of(header: str) -> str:
    """The name in a Host header (port and IPv6 brackets taken off), lower case."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1:header.find("]")] if "]" in header else header
    return header.rpartition(":")[0] if header.count(":") == 1 else header


def port_of(header: str) -> int:
    """The port in a Host header, 80 when it names none (a browser leaves http's default out); -1 when malformed."""
    header = header.strip()
    rest = header[header.find("]") + 1:] if header.startswith("[") else header if header.count(":") == 1 else ""
    port = rest.rpartition(":")[2] if ":" in rest else "80"
    return int(port) if port.isdigit() and port.isascii() else -1


def refused_origin(hosts: frozenset[str] | None, host: str | None, origin: str | None) -> str | None:
    """Why a request's Host or Origin is not served here, or None. A browser names the page's site in Origin on
    every cross-site POST; curl, OpenAI's client and `ask` send none. An Origin must be the request's own origin,
    scheme, name and port (this server speaks plain http, at the Host the browser reached it by): a name alone
    would let any other page on that host (http://localhost:3000, https://127.0.0.1:9) post here."""
    if hosts is None:
        return None
    if not host:
        return "a request needs a Host header"
    if host_of(host) not in hosts:
        return f"Host {host!r} is not served here (serve.allowed_hosts)"
    if origin == "null":
        return "Origin 'null' (a sandboxed or file page) is not served here"
    if origin:
        try:
            url = urlsplit(origin.strip())
            theirs = (url.scheme.lower(), url.hostname or "", url.port or (80 if url.scheme.lower() == "http" else -1))
        except ValueError:                            # a port out of range or not a number
            theirs = None
        if theirs != ("http", host_of(host), port_of(host)):
            return f"Origin {origin[:80]!r} is not this server's own origin (http://{host[:80]})"
    return None
