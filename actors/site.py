"""Site actor: owns the one front for streams served on several nodes (HTTP API, console, zmq questions, PUB) and
the site's end of the links to every node group's output actor (pipeline/serve/site_link.py).

Started by the launcher on its own host when a served run's streams are on several nodes (pipeline/launch/site_actor.py),
before the groups, which connect to it. Each stream has its view in the front (pipeline/serve/front.py), labelled with
its node; a question goes to its stream's node over the link and its answer's tokens come back as the owner's events,
relayed by that node's output actor, which also gets the answer's finished record to journal. A group that says hello
with a new start id was started again (an actor of it died; the links pass only a newer start's, never an earlier
one's replayed): questions still waiting on its streams end with an error (their owner is gone). Holds no sequence
state: when this actor dies the launcher starts it again on the same endpoints, its restarts counted (`args.restarts`
orders the site's starts on the links: a group then takes only the new start's messages), and the groups' links
reconnect (askers in flight lose their connection). Never touches a model, a channel or a journal.
"""
from __future__ import annotations

import json
import os
import sys

from actors.args import SiteArgs
from actors.output import close_publisher, interfaces, publish, publisher
from pipeline.messages import Answer, MessageError, copied, decode
from pipeline.process import Figures, figures_on_request
from pipeline.serve.front import Front
from pipeline.serve.site_link import SiteHub


def run(args: SiteArgs) -> None:
    """Bind the links (the ports bound written to endpoints_file: the launcher reads them there and hands them to
    the groups), then serve every stream's front until the site's stop."""
    cfg, stop = args.cfg, args.stop
    figures_on_request(Figures("site"))
    tok = cfg.target.tokenizer
    hub = SiteHub(args.links.events, args.links.asks, args.links.key, start=args.restarts)   # starts ordered
    with open(args.endpoints_file + ".tmp", "w") as f:
        json.dump(hub.endpoints, f)
    os.replace(args.endpoints_file + ".tmp", args.endpoints_file)
    groups: dict[str, list[str]] = {}
    group_of = {st.name: st.group for st in args.streams}
    for st in args.streams:
        groups.setdefault(st.group, []).append(st.name)
    front = Front(cfg, tok, [(st.name, hub.asks(st.group, st.name), st.archive, st.node) for st in args.streams],
                  args.pids_files, restarts={"site": args.restarts})
    sock = servers = None
    starts: dict[str, str] = {}
    try:
        servers = interfaces(cfg, front) if cfg.serve.enabled else []       # replay --pub: PUB alone
        sock = publisher(args.pub) if args.pub else None
        logged: set[str] = set()
        while not stop.is_set():
            got = hub.recv(0.2)
            for name, record in front.take_direct():                 # answers the archive gave alone
                hub.send_record(group_of[name], name, record)
                if sock is not None:
                    publish(sock, {"stream": name, **record})
            for why in hub.dropped.keys() - logged:                   # each kind of junk once, then counted
                logged.add(why)
                print(f"ringspec: site: dropped a message from a node link: {why} (counted)", file=sys.stderr,
                      flush=True)
            if got is None or got.group not in groups:
                continue
            if got.kind == "hello":
                _hello(front, got.group, groups[got.group], got.record or {}, starts)
                continue
            if got.kind != "event" or got.stream not in groups[got.group]:
                hub.dropped[f"unexpected {got.kind}"] += 1
                continue
            try:
                event = copied(decode(got))
            except MessageError as exc:
                hub.dropped[f"malformed event: {exc}"[:80]] += 1
                continue
            answered = front.on_event(event, got.record, stream=got.stream)
            record = got.record
            if isinstance(event, Answer) and answered is not None:
                hub.send_record(got.group, got.stream, answered)     # the stream's journal is its group's
                record = {"stream": got.stream, **answered}
            if sock is not None and record is not None:
                publish(sock, record)
    finally:
        if hub.dropped:
            print(f"ringspec: site: messages dropped: {dict(hub.dropped)}", file=sys.stderr, flush=True)
        for server in servers or ():
            server.shutdown() if hasattr(server, "shutdown") else server.close()
        if sock is not None:
            close_publisher(sock)
        hub.close()


def _hello(front: Front, group: str, names: list[str], hello: dict, starts: dict) -> None:
    """A group's link (re)connected: its start id, its supervisor's restarts (for /metrics), its streams' Start
    records (a site started again has missed them: /healthz and /metrics read the exactness verdict there), and the
    node it runs on (the streams' `node` label)."""
    start, before = hello.get("start"), starts.get(group)
    starts[group] = start
    front.restarts.update(hello.get("restarts") or {})
    for name, record in (hello.get("starts") or {}).items():
        if name in names and isinstance(record, dict) and not front.views[name].start:
            front.views[name].start = record
    node = hello.get("node")
    if isinstance(node, str) and node:            # where the group runs now (its node died: another one)
        for name in names:
            front.views[name].node = node
    if before is not None and start != before:
        lost = front.lost(set(names), f"streams {', '.join(names)} were started again (an actor of their node "
                                      f"died); ask again")
        if lost:
            print(f"ringspec: site: {lost} questions to streams {', '.join(names)} ended unanswered: their pipeline "
                  f"was started again", file=sys.stderr, flush=True)
