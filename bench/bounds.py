"""`python -m bench.bounds [--finding N ...] [--json]`: issue 55's findings ("every request's work bounded")
reproduced on the tree as it is, one table: the finding, what is measured, the figure, the bound it is held to, and
whether it held.

Owns the reproductions, each a function of this module (`FINDINGS`, one line each in `--help`), a few seconds each:
it calls what measures (bench/question_budget.py, bench/flood.py's site floods, bench/front_flood.py's front floods,
bench/regex_steps.py's step counter) and builds the rest here (a temporary archive, journal and wheelhouse). Never
changes a setting, starts a model or a real server (the floods serve the real faces from a child process), nor
asserts: a bound that did not hold is a row saying so (`held: NO`, exit 1). The figures of the code before the fixes
were taken on older commits (issue 55's note); these run on the code on the path.

Times vary with the machine's load; steps, rows, bytes and status codes do not.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import random
import string
import sys
import tarfile
import tempfile
import time
from contextlib import contextmanager, redirect_stderr
from pathlib import Path

from bench import flood as site_flood
from bench import front_flood, question_budget, regex_steps
from models import registry
from models.registry import ModelUnavailable, RegistryModel
from pipeline.serve import cited
from pipeline.serve import route as router
from pipeline.stream import journal, values
from pipeline.stream.archive import Archive
from pipeline.stream.columns import Headers
from pipeline.stream.journal import Journal
from pipeline.stream.templates import COMPARED, Miner

GROWTH_MB = 64                      # the bound on a process's growth under a question or a flood
PER_CHAR = 200                      # no one pattern call past this many steps a character (bench/fuzz.py's patterns)
LINEAR = 2.5                        # steps at twice the length at most this many times those at the length


def _row(finding: str, measured: str, figure: str, bound: str, held: bool) -> dict:
    return {"finding": finding, "measured": measured, "figure": figure, "bound": bound, "held": held}


# ---- 1: a question's budget -----------------------------------------------------------------------------------------

def finding_1(lines: int = 100_000, keep: bool = False) -> list[dict]:
    path = Path(tempfile.gettempdir()) / f"question_budget-{lines}.sqlite"
    built = question_budget.build(path, lines)
    try:
        rows = [question_budget.measure(path, q) for q in question_budget.QUESTIONS]
        shown = [question_budget.measure(path, "how many lines say connecting?", together=4)]
    finally:
        if not keep:
            for suffix in ("", "-wal", "-shm"):
                Path(str(path) + suffix).unlink(missing_ok=True)
    worst_s = max(rows, key=lambda r: r["wall_s"] or 1e9)
    worst_mb = max(rows, key=lambda r: r["growth_mb"] or 1e9)
    ok = lambda r: r["wall_s"] is not None and r["wall_s"] <= 2 and r["growth_mb"] <= GROWTH_MB
    return [
        _row("1", f"{len(rows)} operator questions on a {lines:,}-line archive (built in {built:.0f} s), each "
             f"cited.read in a forked child: the slowest, the largest", f"{worst_s['wall_s']} s "
             f"({worst_s['question']!r}); +{worst_mb['growth_mb']} MB ({worst_mb['question']!r})",
             f"<= 2 s, <= {GROWTH_MB} MB (the goal at 1M lines)", all(map(ok, rows))),
        _row("1", "'how many lines say connecting?' asked by 4 threads at once", f"{shown[0]['wall_s']} s, "
             f"+{shown[0]['growth_mb']} MB; reply: {shown[0]['reply'][:60]!r}", f"<= 4 x 2 s, <= {GROWTH_MB} MB",
             ok({**shown[0], "wall_s": (shown[0]["wall_s"] or 1e9) / 4})),
    ]


# ---- 2, 3: the site's links (bench/flood.py) -----------------------------------------------------------------------

def finding_2(seconds: float = 3.0) -> list[dict]:
    out = []
    for how, what in (("messages", "4 keyless zmq peers push 6-frame messages with a 4 MiB frame at the site links"),
                      ("multipart", "4 raw ZMTP peers send one endless message of 60 KiB MORE frames")):
        r = site_flood.flood(how, seconds)
        out.append(_row("2", f"{what}, {seconds:g} s: the hub's growth; drops; a real group served after",
                        f"+{r['growth_mb']} MB ({r['sent_mb']} MB sent); dropped {r['dropped']}; "
                        f"served {r['served']}", f"<= {GROWTH_MB} MB, served",
                        r["growth_mb"] <= GROWTH_MB and r["served"]))
    return out


def finding_3(seconds: float = 3.0) -> list[dict]:
    r = site_flood.flood("replay", seconds)
    d = r["dropped"]
    return [_row("3", f"4 key holders replay an earlier start's hello and the live start's old counter, {seconds:g} "
                 "s: drops by reason; the live group served after",
                 f"stale_start {d.get('stale_start', 0)}, replayed {d.get('replayed', 0)}; +{r['growth_mb']} MB; "
                 f"served {r['served']}", "every replay dropped (none retires the live start), served",
                 bool(d.get("stale_start")) and bool(d.get("replayed")) and r["served"]
                 and r["growth_mb"] <= GROWTH_MB)]


# ---- 4, 11, 12: the operators' fronts (bench/front_flood.py) --------------------------------------------------------

def finding_4(seconds: float = 3.0) -> list[dict]:
    out = []
    for how in ("zmq", "zmq-nokeys"):
        r = front_flood.flood(how, seconds)
        out.append(_row("4", f"24 keyless DEALERs push 64 KiB messages {seconds:g} s while one question holds "
                        f"`ask` ({'a server with keys' if how == 'zmq' else 'a server without keys'}): growth; a "
                        "keyed question meanwhile", f"+{r['growth_mb']} MB; answered {r['keyed_answered']}",
                        f"<= {GROWTH_MB} MB, answered", r["growth_mb"] <= GROWTH_MB and r["keyed_answered"]))
    r = front_flood.flood("multipart", seconds)
    out.append(_row("4", f"4 raw ZMTP peers send one endless message of 60 KiB MORE frames, {seconds:g} s",
                    f"+{r['growth_mb']} MB ({r['sent_mb']} MB sent)", f"<= {GROWTH_MB} MB",
                    r["growth_mb"] <= GROWTH_MB))
    return out


def finding_11() -> list[dict]:
    r = front_flood.flood("loopback")
    return [_row("11", "16 keyless sockets from 127.0.0.1 hold a begun request; 12 /healthz + 12 keyed /v1/models "
                 "from 127.0.0.1: status codes", json.dumps(r["codes"]), "24 x 200",
                 r["codes"] == {"healthz 200": 12, "keyed 200": 12})]


def finding_12() -> list[dict]:
    r = front_flood.flood("heads")
    out = [_row("12", "16 keyless sockets each send 99 header lines of 64,000 B, never ending the head: growth, "
                "replies", f"+{r['growth_mb']} MB; {json.dumps(r['codes'])}", f"<= {GROWTH_MB} MB, 431 x 16",
                r["growth_mb"] <= GROWTH_MB and r["codes"] == {"431": 16})]
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "j.jsonl")
        planted, target = Path(path + ".1"), Path(d) / "elsewhere"
        target.write_text('{"kind": "answer", "text": "planted"}\n')
        planted.symlink_to(target)                # not a file the journal wrote (as another user's file is not)
        raised, told = None, io.StringIO()
        with redirect_stderr(told):               # the journal tells of the planted file once: counted, not shown
            j = Journal(path, max_bytes=2000, keep=3)
            try:
                for n in range(40):
                    j.append({"kind": "answer", "id": n, "text": "x" * 200})
            except OSError as exc:
                raised = exc
            finally:
                j.close()
            read = any("planted" in str(rec.get("text")) for rec in journal.history(path))
        mode = os.stat(path).st_mode & 0o777
        kept = planted.is_symlink() and target.read_text().startswith('{"kind": "answer", "text": "planted"}')
        out.append(_row("12", "--journal F: F's mode; 40 answers rotating past a planted F.1 (a symlink)",
                        f"mode {oct(mode)}; rotation raised {type(raised).__name__ if raised else 'nothing'}; "
                        f"planted read {read}, left as planted {kept}", "0o600; rotates; planted never read",
                        mode == 0o600 and raised is None and not read and kept))
    headers, names = Headers(), []
    for i, text in enumerate(["#Software: IIS", "#Version: 1.0", "#Fields: date time c-ip cs-method sc-status",
                              "2026-12-06 05:00:00 10.0.0.1 GET 200", "#Fields: x-user x-password a b c",
                              "2026-12-06 05:00:01 10.0.0.2 GET 404"]):
        header = headers.take(text, first=i == 0)
        if not text.startswith("#"):
            names.append(" ".join(header.names) if header else None)
    out.append(_row("12", "a W3C log's rows, a lone '#Fields:' line among them (as a logged line could write): the "
                    "columns of the row after it", f"{names[-1]!r}; header lines refused {headers.refused}",
                    "the log's own header's columns", names[-1] == names[0] and headers.refused == 1))
    return out


# ---- 5, 9, 10: linear patterns (bench/regex_steps.py) ---------------------------------------------------------------

def _steps(fn, *modules) -> int | str:
    """The regex steps of fn() over the modules' patterns; 'past N a char' if one call passed PER_CHAR a character."""
    try:
        with regex_steps.counting(*modules, per_char=PER_CHAR) as tally:
            fn()
        return tally.steps
    except regex_steps.TooManySteps:
        return f"past {PER_CHAR} a char"


def _linear(name: str, measured: str, at, modules, sizes=(1800, 3600)) -> dict:
    """Steps and wall time of at(n)() at two sizes: held when no call passed PER_CHAR a character and the steps at
    the larger size are at most LINEAR times those at the smaller."""
    counted = {n: _steps(at(n), *modules) for n in sizes}
    t0 = time.perf_counter()
    at(sizes[-1])()
    ms = (time.perf_counter() - t0) * 1e3
    small, large = counted[sizes[0]], counted[sizes[-1]]
    held = isinstance(small, int) and isinstance(large, int) and large <= LINEAR * max(small, 1)
    shown = {n: f"{v:,} steps" if isinstance(v, int) else v for n, v in counted.items()}
    figure = f"{shown[sizes[-1]]} at {sizes[-1]}, {shown[sizes[0]]} at {sizes[0]}"
    return _row(name, measured, f"{figure}; {ms:.1f} ms",
                f"<= {LINEAR} x steps at 2 x length; no call past {PER_CHAR} steps a char", held)


def finding_5() -> list[dict]:
    tmp = Path(tempfile.mkdtemp(prefix="bounds5_"))

    def at(n):
        path = tmp / f"a{n}.sqlite"
        if not path.exists():
            with Archive(path) as a:
                for i in range(5):
                    a.add(i, "", "gw7 a" + "1" * n + " b port 22")
        return lambda: cited.read(str(path), "which port did gw7 use?")

    try:
        row = _linear("5", "cited.read 'which port did gw7 use?' over 5 lines 'gw7 a' + '1' x N + ' b port 22': "
                      "cited's regex steps", at, (cited,))
        row["figure"] += f"; answer {getattr(at(3600)(), 'answer', None)!r}"
        return [row]
    finally:
        for p in tmp.iterdir():
            p.unlink()
        tmp.rmdir()


def finding_9() -> list[dict]:
    def question(n):                 # at n=560: 650 characters, 334 tokens of the default model's tokenizer
        return "which port did " + "w" * n + " " + " ".join(f"k{i}" for i in range(20 * n // 560)) + " use?"

    return [_linear("9", "route() of 'which port did ' + 'w' x N + 20 keys ' use?' (N=560: 334 tokens): route's "
                    "and values' regex steps", lambda n: lambda: router.route(question(n)), (router, values),
                    sizes=(280, 560))]


def finding_10() -> list[dict]:
    crafted = {"host:port run": lambda n: "a" * (n - 5) + ":/ :x", "scheme run": lambda n: ("a." * n)[:n - 2] + ":/",
               "many values": lambda n: " ".join(["1.5 kB 10.0.0.1 x1"] * 220)[:n]}
    return [_linear("10", f"values_of a crafted line ({name}), 4,096 characters: values' regex steps",
                    lambda n, make=make: lambda: values.values_of(make(n)), (values,), sizes=(2048, 4096))
            for name, make in crafted.items()]


# ---- 6: model parts as data only -----------------------------------------------------------------------------------

@contextmanager
def _env(**changes):
    saved = {k: os.environ.get(k) for k in changes}
    os.environ.update(changes)
    try:
        yield
    finally:
        for k, v in saved.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)


def finding_6() -> list[dict]:
    """A one-part model whose part the wheelhouse offers only as an sdist whose build backend writes a mark."""
    fake = RegistryModel("bounds-fake", "ringspec-bounds-part{n}", "0.1.0", 1, "ringspec_bounds_part{n}/p.bin",
                         "bounds.gguf", 4, "0" * 64, "issue 55 finding 6's reproduction")
    with tempfile.TemporaryDirectory() as d:
        house, mark = Path(d) / "wheelhouse", Path(d) / "built"
        house.mkdir()
        base = "ringspec_bounds_part1-0.1.0"
        files = {"pyproject.toml": '[build-system]\nrequires = []\nbuild-backend = "backend"\nbackend-path = ["."]\n',
                 "backend.py": f"open({str(mark)!r}, 'w').write('built')\n",
                 "PKG-INFO": "Metadata-Version: 2.1\nName: ringspec-bounds-part1\nVersion: 0.1.0\n"}
        with tarfile.open(house / f"{base}.tar.gz", "w:gz") as tf:
            for name, text in files.items():
                info = tarfile.TarInfo(f"{base}/{name}")
                info.size = len(text.encode())
                tf.addfile(info, io.BytesIO(text.encode()))
        registry.MODELS[fake.name] = fake
        try:
            with _env(RINGSPEC_HOME=str(Path(d) / "home"), PIP_NO_INDEX="1", PIP_FIND_LINKS=str(house)):
                registry.resolve_gguf(fake.name)
            said = "fetched (not refused)"
        except ModelUnavailable as exc:
            said = str(exc)
        finally:
            del registry.MODELS[fake.name]
        ran = mark.exists()
    named = "ringspec-bounds-part1" in said and "only-binary" in said
    figure = f"backend ran {ran}; " + ("refused naming ringspec-bounds-part1 and --only-binary" if named else
                                        f"not refused by name: {said[:70]!r}")
    return [_row("6", "a model part offered only as an sdist (its build backend writes a mark): pip's refusal, and "
                 "whether the backend ran", figure, "refused by name, backend never run", named and not ran)]


# ---- 7, 8: bounded files -------------------------------------------------------------------------------------------

def finding_7(answers: int = 20_000) -> list[dict]:
    with tempfile.TemporaryDirectory() as d:
        path, max_bytes, keep = os.path.join(d, "j.jsonl"), int(0.05 * (1 << 20)), 4
        j = Journal(path, max_bytes=max_bytes, keep=keep)
        j.append({"kind": "checkpoint", "source": "/s.csv", "offset": 10, "loop": 0, "seq": 1, "offsets": [10],
                  "position": 10, "window_offset": 0, "window_loop": 0, "window_seq": 0, "lines": 1, "since": 0,
                  "t": 0.0})
        record = {"kind": "answer", "id": 0, "question": "which port did gw7 use?", "text": "port 443 " * 20, "t": 0.0}
        for n in range(answers):                   # the stream idle: answers alone
            j.append({**record, "id": n, "t": time.time()})
        j.close()
        sizes = [os.path.getsize(f) for f in journal.files(path)]
    slack = 1000                                   # one record and the checkpoint a new file starts with
    return [_row("7", f"{answers:,} answers and no lines into a journal of journal_max_mb 0.05, keep {keep}: its "
                 "files", f"{len(sizes)} files, largest {max(sizes) / 1024:.1f} KiB, {sum(sizes) / 1024:.1f} KiB in "
                 "all", f"<= {keep} files of <= {max_bytes / 1024:.1f} KiB (+ one record)",
                 len(sizes) <= keep and max(sizes) <= max_bytes + slack)]


def finding_8(lines: int = 10_000) -> list[dict]:
    rng = random.Random(55)

    def distinct():                                # one group; no two alike in half their tokens
        return "evt " + " ".join("".join(rng.choice(string.ascii_lowercase) for _ in range(6)) for _ in range(5))

    out = []
    with tempfile.TemporaryDirectory() as d:
        with Archive(os.path.join(d, "a.sqlite"), max_lines=100, flush_every=64) as a:
            for i in range(lines):
                a.add(i, "", distinct())
            a.flush()
            rows = a.con.execute("SELECT count(*) FROM templates").fetchone()[0]
        out.append(_row("8", f"{lines:,} distinct lines into an archive of max_lines 100: template rows kept",
                        f"{rows} template rows", "<= max_lines (100)", rows <= 100))
        crafted = ("1 " * 2048)[:4096]
        with Archive(os.path.join(d, "b.sqlite"), max_lines=1000) as b:
            for i in range(100):
                b.add(i, "", crafted)
            b.flush()
            per_line = max(c for (c,) in b.con.execute("SELECT count(*) FROM vals GROUP BY seq"))
            cap = b.max_values
        out.append(_row("8", "a crafted 4 KB line ('1 ' x 2048) x 100: value rows a line", f"{per_line} value rows",
                        f"<= archive max_values ({cap})", per_line <= cap))
    m = Miner()
    for _ in range(lines):
        m.add(distinct())
    before, t0 = m.compared, time.perf_counter()
    for _ in range(200):
        m.add(distinct())
    ms, per = (time.perf_counter() - t0) / 200 * 1e3, (m.compared - before) / 200
    out.append(_row("8", f"a miner at {lines:,} templates of one group: templates compared a new line",
                    f"{per:.1f} compared a line ({len(m.templates):,} templates held); {ms:.2f} ms a line",
                    f"<= COMPARED + 1 ({COMPARED + 1})", per <= COMPARED + 1))
    return out


FINDINGS = {                        # number -> (its reproduction, one line for --help)
    "1": (finding_1, "questions on an archive of --lines lines (question_budget.build/measure): worst time, growth"),
    "2": (finding_2, "keyless 4 MiB messages and endless multiparts at the site's links (bench/flood.py): growth"),
    "3": (finding_3, "an earlier start's hello and old counters replayed at the site hub: drops, group served"),
    "4": (finding_4, "24 keyless peers and endless multiparts at the operators' zmq front (front_flood): growth"),
    "5": (finding_5, "cited.read 'which port did gw7 use?' over 5 long crafted lines: regex steps at 2 lengths"),
    "6": (finding_6, "a model part offered only as an sdist in a temp wheelhouse: refused by name, never built"),
    "7": (finding_7, "20,000 answers and no lines into a 0.05 MB journal: its files and their sizes"),
    "8": (finding_8, "10,000 distinct lines / a crafted 4 KB line into the archive: templates, values, miner"),
    "9": (finding_9, "route() of a 334-token question: regex steps at 2 lengths"),
    "10": (finding_10, "values_of three crafted 4 KB lines: regex steps at 2 lengths"),
    "11": (finding_11, "16 keyless loopback sockets at the HTTP front: /healthz and keyed status codes"),
    "12": (finding_12, "never-ending heads at the HTTP front; the journal's mode, a planted F.1; a lone #Fields line"),
}


def run(findings, lines: int = 100_000, seconds: float = 3.0, keep: bool = False, progress=None) -> list[dict]:
    rows = []
    for n in findings:
        fn = FINDINGS[n][0]
        t0 = time.perf_counter()
        if n == "1":
            got = fn(lines, keep)
        elif n in ("2", "3", "4"):
            got = fn(seconds)
        else:
            got = fn()
        for r in got:
            r["took_s"] = round(time.perf_counter() - t0, 1)
        rows.extend(got)
        if progress:
            progress(got)
    return rows


def table(rows: list[dict]) -> str:
    head = ("finding", "measured", "figure", "bound", "held")
    body = [(r["finding"], r["measured"], r["figure"], r["bound"], "yes" if r["held"] else "NO") for r in rows]
    return "\n".join(" | ".join(cells) for cells in [head, ("---",) * 5, *body])


def main(argv=None) -> int:
    each = "\n".join(f"  {n:>2}  {line}" for n, (_, line) in FINDINGS.items())
    p = argparse.ArgumentParser(prog="python -m bench.bounds", description=__doc__,
                                epilog=f"findings (issue 55):\n{each}",
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--finding", action="append", choices=list(FINDINGS), metavar="N",
                   help="run this finding's reproduction (repeatable; default: all)")
    p.add_argument("--lines", type=int, default=100_000, help="finding 1: lines in the archive (default %(default)s; "
                   "the issue's goal is at 1000000, whose build takes about two minutes)")
    p.add_argument("--keep", action="store_true", help="finding 1: keep the archive in the temp directory")
    p.add_argument("--seconds", type=float, default=3.0, help="findings 2-4: each flood's length (default %(default)s)")
    p.add_argument("--json", action="store_true", help="print the rows as JSON lines")
    a = p.parse_args(argv)
    chosen = a.finding or list(FINDINGS)
    shown = (lambda got: [print(json.dumps(r), flush=True) for r in got]) if a.json else \
        (lambda got: print(f"finding {got[0]['finding']} done", file=sys.stderr, flush=True))
    rows = run(sorted(set(chosen), key=int), a.lines, a.seconds, a.keep, shown)
    if not a.json:
        print(table(rows))
    return 0 if all(r["held"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
