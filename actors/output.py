"""Output actor: owns stdout, the append-only JSONL journal, the zmq PUB socket and, when serving, the operators'
front (HTTP API, console, zmq questions: pipeline/serve/front.py).

The journal is where durability lives (pipeline/stream/journal.py): every record is fsynced before the event's next
step, so a checkpoint it holds makes its lines committed and an assessment it holds is written.

Receives events from the cache owner (pipeline/messages.py); detokenizes assessments and checks the tags they mention
against the tags of the lines the model could see (a mentioned tag none of them carries is counted as hallucinated);
hands answer tokens to the front, which streams them to whoever asked; writes each event once to every sink, as its
record (pipeline/stream/events.py, the serial replay's too; this actor adds the figures); prints what the record
shows. Never touches a model or the cache.

At a site (streams served on several nodes: pipeline/launch/site_actor.py) the front is the site actor's (actors/site.py):
this actor relays every event with its record there, puts the site's questions on its owners' channels, and journals
the answers' records the site sends back (pipeline/serve/site_link.py); PUB is the site's.
"""
from __future__ import annotations

import json
import os
import stat
import sys
import time
from contextlib import ExitStack

import zmq

from actors.args import FrontArgs, OutputArgs
from pipeline.channel import Channel, Selector
from pipeline.messages import (
    Answer,
    AnswerDelta,
    Assessment,
    Cancel,
    Eof,
    MessageError,
    Question,
    Start,
    Status,
    copied,
    decode,
    send,
)
from pipeline.process import Figures, attach_when_ready, chaos, figures_on_request, pin
from pipeline.serve.auth import load_keys
from pipeline.serve.front import Front
from pipeline.serve.http_api import serve_http
from pipeline.serve.site_link import NodeLink
from pipeline.serve.zmq_api import ZmqFront
from pipeline.stream.events import journaled, named, record_of, show
from pipeline.stream.journal import Journal

HELLO_S = 5.0       # at a site, this group says hello again this often (pipeline/serve/site_link.py)


def run(args: OutputArgs) -> None:
    """Stream n's events arrive on in_specs[n] (created here) and go to journals[n]; with several streams, every
    record carries its stream's name (`streams[n]`) and so does every printed line. serve: the pipeline serves
    operators, and the HTTP and zmq interfaces run in this process (pipeline/serve/front.py). site: the run's
    streams are on several nodes and served, the front is the site actor's (actors/site.py) and this actor relays
    (pipeline/serve/site_link.py)."""
    streams, quiet_lines, stop, site = args.streams, args.quiet_lines, args.stop, args.site
    pin(args.cpus)
    figures = Figures("output")
    figures_on_request(figures)
    tok = args.model.tokenizer
    stops = set(tok.stop_ids)
    sock = publisher(args.pub) if args.pub else None
    logs = [Journal.of(j, args.cfg.supervise) if j else None for j in args.journals]
    front = servers = link = None
    started: dict[str, dict] = {}                # each stream's Start record (a site's hello)
    try:
        with ExitStack() as held:
            inps = [held.enter_context(Channel.create(spec)) for spec in args.in_specs]
            if args.serve:
                front, servers = start_front(args.cfg, tok, args.serve, streams, stop)
            if site:
                link = NodeLink({"events": site.links.events, "asks": site.links.asks, "key": site.links.key,
                                 "group": site.group, "start": site.start})
                asks = [attach_when_ready(name, stop) for name in site.asks_channels]
                link.hello(site.start, site.restarts, started, site.node)
            selector, ended, hello_at = Selector(inps, [link.socket] if link else ()), set(), time.monotonic()
            while len(ended) < len(inps) and not stop.is_set():
                ready = selector.wait(0.2)
                if link is not None:
                    _from_site(link, streams, asks, logs, quiet_lines)
                    if time.monotonic() - hello_at > HELLO_S:     # a site started again learns who this is
                        link.hello(site.start, site.restarts, started, site.node)
                        hello_at = time.monotonic()
                for name, record in front.take_direct() if front is not None and link is None else ():
                    _record(named(record, name), logs[streams.index(name)], sock)   # the archive answered alone
                for inp in ready:
                    n = inps.index(inp)
                    name, log = streams[n], logs[n]
                    with figures.busy():
                        with inp.recv(timeout=1.0) as received:
                            event = copied(decode(received))
                        record = None                # the front's own events have none but an answer's (below)
                        if not isinstance(event, (AnswerDelta, Answer, Status)):
                            record = named(record_of(event, tok, stops), name)
                        if isinstance(event, Start):
                            started[name] = record          # for a site started again (the hello carries it)
                        if isinstance(event, Eof):
                            figures.extra["inbox_max_depth"] = max(i.max_depth for i in inps)
                            record["figures"] = event.figures + [figures.snapshot()]
                            ended.add(n)
                        if link is not None:
                            link.relay(name, event, record)
                        elif front is not None:
                            answered = front.on_event(event, record, stream=name)
                            if answered is not None:
                                record = named(answered, name)
                        if record is None:
                            continue
                        _record(record, log, sock)
                        if isinstance(event, Assessment):
                            chaos("output.written")      # fault injection, test-only: written, not yet shown
                        show(record, quiet_lines)
    finally:
        for server in servers or ():          # the HTTP server shuts down, the zmq front closes
            if hasattr(server, "shutdown"):
                server.shutdown()
            else:
                server.close()
        if link is not None:
            if link.dropped:
                print(f"ringspec: output: messages the site link dropped: {dict(link.dropped)}", file=sys.stderr,
                      flush=True)
            link.close()
        for log in logs:
            if log:
                log.close()
        if sock is not None:
            close_publisher(sock)


def _from_site(link: NodeLink, streams: list[str], asks: list, logs: list, quiet_lines: bool) -> None:
    """What the site sent this group: questions and cancels for its owners, and answers' records to journal. A
    question its owner cannot take now is answered with an error at once; anything else is dropped and counted."""
    for got in link.take():
        if got.stream not in streams:
            link.dropped["unknown_stream"] += 1
            continue
        n = streams.index(got.stream)
        if got.kind == "record" and got.record is not None:
            record = named(got.record, got.stream)
            _record(record, logs[n], None)
            show(record, quiet_lines)
            continue
        try:
            msg = decode(got) if got.kind == "ask" and n < len(asks) else None     # none when not serving
        except MessageError:
            msg = None
        if not isinstance(msg, (Question, Cancel)):
            link.dropped[f"not_a_question: {got.kind}"] += 1
            continue
        try:
            send(asks[n], msg, timeout=1.0)
        except TimeoutError:
            if isinstance(msg, Question):
                link.relay(got.stream, Answer(id=msg.id, error="the cache owner takes no questions right now; retry "
                                              "shortly", prompt_tokens=len(msg.ids)))
            else:
                link.dropped["cancel_undelivered"] += 1


def _record(record: dict, log, sock) -> None:
    """The journal takes what it keeps (`journaled`), durably; PUB takes the stream's own (`publish`)."""
    if log and journaled(record):
        log.append(record)
    if sock is not None:
        publish(sock, record)


# what PUB carries: the stream's own events. Any local user who reaches the socket reads it (zmq has no key here), so
# an operator's question and answer ("answer") never go out on it, and a kind added later stays off until listed.
PUBLISHED = frozenset({"start", "line", "assessment", "checkpoint", "recovery", "restart", "capacity", "eof"})


# How long a closing PUB may still spend handing its last events (the Eof and its figures) to connected subscribers:
# with LINGER 0 zmq discards what is queued at close, and a subscriber lost the Eof when the actor exited fast (a
# soak's report without the target's figures, seen in CI). A subscriber too slow to take them is not waited for.
PUB_LAST_MS = 2000


def publisher(endpoint: str) -> zmq.Socket:
    """The PUB socket the stream's events go out on (this actor's, or the site actor's), in a zmq context of its own
    (`close_publisher` ends both). An ipc endpoint binds in a directory of this user's that no one else can enter
    (`private_dir`)."""
    pub_dir(endpoint)
    sock = zmq.Context().socket(zmq.PUB)
    sock.setsockopt(zmq.LINGER, 0)
    sock.bind(endpoint)
    return sock


def close_publisher(sock: zmq.Socket) -> None:
    """Close a `publisher` once what it queued went out, for at most PUB_LAST_MS. The wait is the context's `term`:
    a linger alone is kept by zmq's I/O thread, and an actor leaves through os._exit (multiprocessing's children do),
    which ends that thread with the events still queued."""
    ctx = sock.context
    sock.close(linger=PUB_LAST_MS)
    ctx.term()


def pub_dir(endpoint: str) -> None:
    """An ipc endpoint's directory made or kept private (`private_dir`); the launcher asks before any actor starts,
    so a directory open to others is refused once, by name, not by an actor dying at every restart."""
    if endpoint.startswith("ipc://"):
        private_dir(os.path.dirname(os.path.abspath(endpoint[len("ipc://"):])))


def private_dir(path: str) -> None:
    """Make `path` a 0700 directory of this user's, or keep one that is; PermissionError for one that exists wider,
    is another user's, or is not a directory (a symlink included): its socket would be open to others."""
    try:
        os.mkdir(path, 0o700)
        os.chmod(path, 0o700)                         # mkdir's mode passes through the umask
    except FileExistsError:
        pass
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
        raise PermissionError(f"PUB directory {path} is {oct(stat.S_IMODE(st.st_mode))}, uid {st.st_uid}"
                              f"{'' if stat.S_ISDIR(st.st_mode) else ', not a directory'}: it must be a directory "
                              f"of this user ({os.geteuid()}) with mode 0700, or one the PUB can create")


def publish(sock: zmq.Socket, record: dict) -> None:
    """One stream event on PUB: its kind, then the record as JSON; any other record (an operator's answer) is
    dropped here, whichever actor publishes (`PUBLISHED`)."""
    if record["kind"] not in PUBLISHED:
        return
    sock.send_multipart([record["kind"].encode(), json.dumps(record).encode()])


def start_front(cfg, tok, serve: FrontArgs, streams: tuple[str, ...], stop):
    """The operators' interfaces: the front (its channel to each stream's owner), then HTTP and zmq as configured."""

    links = [(name, attach_when_ready(asks, stop), archive)
             for name, asks, archive in zip(streams, serve.asks, serve.archives)]
    front = Front(cfg, tok, links, serve.pids_file, serve.restarts)
    return front, interfaces(cfg, front)


def interfaces(cfg, front: Front) -> list:
    """HTTP and zmq over `front`, as configured (this actor's, or the site actor's)."""
    keys = load_keys(cfg.serve.api_key, cfg.serve.api_keys_file)
    servers = []
    if cfg.serve.http:
        host, _, port = cfg.serve.http.rpartition(":")
        try:
            server = serve_http(front, host.strip("[]"), int(port), keys)
        except OSError as exc:
            raise OSError(f"cannot serve HTTP on {cfg.serve.http}: {exc.strerror or exc}") from None
        servers.append(server)
        print(f"ringspec: serving http://{host}:{server.server_address[1]}/ (OpenAI API under /v1, console at /)",
              file=sys.stderr, flush=True)
    if cfg.serve.zmq:
        servers.append(ZmqFront(front, cfg.serve.zmq, keys))
        print(f"ringspec: zmq questions on {cfg.serve.zmq} (python run.py ask --zmq {cfg.serve.zmq} \"...\")",
              file=sys.stderr, flush=True)
    return servers
