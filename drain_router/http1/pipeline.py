"""The requests a client pipelined ahead of their turn: at most :data:`MAX_PIPELINED` parsed ones
wait (a :class:`Pipeline`, made when a connection's first request has to wait); the rest of what
the client sent stays unparsed, and reading pauses, until they start, so a pipelining client costs
bounded memory. The reader (:mod:`.reader`) feeds a read that may hold more than one head one
head at a time (:func:`feed_heads`) and queues each request that cannot start yet
(:func:`enqueue`); the connection (:mod:`.client`) takes each in its turn (:meth:`Pipeline.take`).
"""

from __future__ import annotations

from collections import deque
from typing import Any, Protocol

import httptools

from drain_router.http1.backpressure import PIPELINE
from drain_router.http1.exchange import Client, Exchange

#: Parsed requests that may wait for their turn on a connection (what follows waits unread).
MAX_PIPELINED = 8

HEAD_END = b"\r\n\r\n"

Queued = Exchange | tuple[bytes, bytes, bool, bool]  # an exchange, or a probe: path, method, keep-alive, 1.0


class Fed(Protocol):
    """A connection's request reader, as the pipeline feeds it and holds its input back."""

    queue: Pipeline | None
    """Made when the first request has to wait."""
    unparsed: bytes
    """What the client sent after the requests waiting, parsed once one starts."""
    dropped: bool

    @property
    def parser(self) -> Any: ...
    @property
    def conn(self) -> Client: ...
    @property
    def body_left(self) -> int: ...
    @property
    def input_closed(self) -> bool: ...

    def received(self, data: bytes, resumed: bool = False) -> None: ...


def _feed(parser: Any, chunk: bytes | memoryview, at: int) -> None:
    """Feed ``chunk``, which starts ``at`` bytes into the read: an upgrade's offset (where what
    follows the handshake starts) is reported from the start of the read, as a whole read's is."""
    try:
        parser.feed_data(chunk)
    except httptools.HttpParserUpgrade as exc:
        raise httptools.HttpParserUpgrade(at + exc.args[0]) from None


def feed_heads(reader: Fed, data: bytes, cut: int) -> None:
    """Feed ``data`` one request head at a time (llhttp ends a head only at a blank line), so that
    no more than MAX_PIPELINED requests wait: the rest waits in the reader's ``unparsed``.
    ``cut``: where the first head ends (3: none does)."""
    parser = reader.parser
    at = 0  # what of data is parsed
    end = len(data)
    while True:
        queue = reader.queue
        if queue and len(queue) >= MAX_PIPELINED:
            reader.unparsed = data[at:]
            reader.conn.pause_reading(PIPELINE)
            return
        if cut < 4 or cut >= end:  # no head ends before the end of this read
            _feed(parser, memoryview(data)[at:] if at else data, at)
            return
        _feed(parser, memoryview(data)[at:cut], at)
        at = cut
        if reader.input_closed:
            reader.dropped = True
            return
        cut = data.find(HEAD_END, at + reader.body_left) + 4


def enqueue(reader: Fed, entry: Queued) -> None:
    """``entry`` waits for its turn, and so does what follows it (reading pauses)."""
    queue = reader.queue
    if queue is None:
        queue = reader.queue = Pipeline(reader)
    queue.append(entry)
    reader.conn.pause_reading(PIPELINE)


class Pipeline(deque[Queued]):
    """Parsed requests waiting for their turn, oldest first."""

    __slots__ = ("reader", "resume_scheduled")

    def __init__(self, reader: Fed) -> None:
        super().__init__()
        self.reader = reader
        self.resume_scheduled = False

    def take(self) -> Queued:
        """The next request's turn has come: what waited unparsed behind it is parsed soon (with the
        loop's stack clean), or reading resumes once nothing waits."""
        entry = self.popleft()
        reader = self.reader
        if reader.unparsed and not self.resume_scheduled:
            self.resume_scheduled = True
            reader.conn.listener.loop.call_soon(self._resume_parse)
        elif not self and not reader.unparsed:
            reader.conn.resume_reading(PIPELINE)
        return entry

    def _resume_parse(self) -> None:
        """A waiting request started: parse what waited behind it."""
        self.resume_scheduled = False
        reader = self.reader
        if reader.conn.transport is None or reader.input_closed or not reader.unparsed:
            return
        data, reader.unparsed = reader.unparsed, b""
        reader.received(data, True)
        if not reader.unparsed and not self:
            reader.conn.resume_reading(PIPELINE)
