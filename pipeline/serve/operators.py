"""Operator requests as the cache owner schedules them: a fair queue with deadlines.

Owns the order in which waiting questions are answered: round robin across operators (one request per operator per
turn, first come first served within one operator), and the deadline of each (a request still waiting at its deadline
is not started; one being answered stops there). Never reads a clock itself and never touches the model.
"""
from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass, field

import numpy as np


@dataclass
class Request:
    id: str                      # the front's id for the request (answers and cancels carry it)
    client: str                  # who asked: an API key, a "user" field or a peer address
    ids: np.ndarray              # the question span's tokens (pipeline/stream/prompts.py frames it)
    max_tokens: int
    deadline: float              # monotonic clock
    arrived: float               # monotonic clock, when the owner took it
    stop_ids: tuple = ()
    meta: dict = field(default_factory=dict)


class OperatorQueue:
    def __init__(self):
        self._by_client: OrderedDict[str, deque[Request]] = OrderedDict()

    def __len__(self) -> int:
        return sum(len(q) for q in self._by_client.values())

    def push(self, req: Request) -> None:
        self._by_client.setdefault(req.client, deque()).append(req)

    def pop(self) -> Request | None:
        """The next request: the first operator in turn gives its oldest request and goes to the back of the line."""
        if not self._by_client:
            return None
        client, waiting = next(iter(self._by_client.items()))
        req = waiting.popleft()
        del self._by_client[client]
        if waiting:
            self._by_client[client] = waiting
        return req

    def expired(self, now: float) -> list[Request]:
        """Remove and return the requests whose deadline passed while they waited."""
        gone = []
        for client in list(self._by_client):
            keep = deque()
            for req in self._by_client[client]:
                (gone if req.deadline <= now else keep).append(req)
            if keep:
                self._by_client[client] = keep
            else:
                del self._by_client[client]
        return gone

    def cancel(self, request_id: str) -> Request | None:
        """Remove a waiting request (its client went away); None when it is not waiting."""
        for client, waiting in self._by_client.items():
            for req in waiting:
                if req.id == request_id:
                    waiting.remove(req)
                    if not waiting:
                        del self._by_client[client]
                    return req
        return None
