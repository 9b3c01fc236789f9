"""The request half of an exchange: sent in its turn unless the router refuses it, its head and body
forwarded to the upstream connection the pool gives it, re-chunked when the client's body is
chunked, bounded by ``--max-request-body-bytes``, and buffered (at most :data:`PENDING_BODY_BYTES`)
while that connection is still being opened; sent once more, on a fresh connection, when the pooled
one it was given turns out closed. An :class:`~drain_router.http1.exchange.Exchange` calls these
with itself, as the :class:`Forwarded` they act on (no back-reference: a finished exchange is freed
at once), and holds a :class:`RequestBody` when its request has a body."""

from __future__ import annotations

from typing import Protocol

from drain_router.http1 import answers
from drain_router.http1.backpressure import PENDING
from drain_router.http1.heads import RequestHead, retryable, websocket_request
from drain_router.http1.roles import Client, Destination
from drain_router.http1.upstream.connection import Owner, UpstreamConnection
from drain_router.http1.upstream.pool import Waiter
from drain_router.metrics import Outcome

#: Request body bytes buffered while the upstream connection is being opened, before the client is
#: no longer read.
PENDING_BODY_BYTES = 64 * 1024


class Forwarded(Owner, Waiter, Protocol):
    """The exchange whose request is forwarded, as forwarding acts on it (the pool's waiter, then
    the owner of the connection it is given)."""

    upstream: UpstreamConnection | None
    """The pooled connection it holds."""
    reused: bool
    """That connection had served requests before."""
    retried: bool
    discard: bool
    """Its body is read and dropped (a refused request's, or past a limit)."""

    @property
    def client(self) -> Client: ...
    @property
    def dest(self) -> Destination: ...
    @property
    def request(self) -> RequestHead | None: ...
    @property
    def problem(self) -> answers.Error | None: ...
    @property
    def body(self) -> RequestBody | None: ...
    @property
    def method(self) -> bytes: ...
    @property
    def http10(self) -> bool: ...
    @property
    def req_done(self) -> bool: ...
    @property
    def head_sent(self) -> bool: ...

    def abort(self, outcome: Outcome) -> None: ...
    def reply(self, error: answers.Error, outcome: Outcome, *, close: bool = False) -> None: ...


def body_of(request: RequestHead | None) -> RequestBody | None:
    """The body a request has (forwarded as it arrives), or None."""
    if request is not None and (request.chunked or request.content_length):
        return RequestBody(request.chunked)
    return None


def send(exchange: Forwarded) -> None:
    """Its turn has come: refused (its head was, or it is past a limit), else handed to the pool
    (which gives it a connection: :func:`attach`)."""
    client = exchange.client
    request = exchange.request
    if request is None or exchange.problem is not None:
        exchange.discard = True
        exchange.reply(exchange.problem or answers.BAD_REQUEST, Outcome.REJECTED, close=client.close_after)
        return
    if request.upgrade and exchange.ws_key is not None:
        client.close_after = True  # unless the upstream switches protocols
    elif request.upgrade:
        client.close_after = True
        exchange.discard = True
        exchange.reply(answers.UPGRADE, Outcome.REJECTED, close=True)
        return
    length = request.content_length
    listener = client.listener
    limit = listener.max_body
    if length is not None and length > limit:
        exchange.discard = True
        exchange.reply(answers.too_large(limit), Outcome.REJECTED, close=True)
        return
    if request.expect_continue and not exchange.http10 and not exchange.req_done:
        client.transport.write(answers.CONTINUE)
    pool = exchange.dest.pool
    assert pool is not None  # (a destination has none only while its gate holds every request)
    pool.acquire(exchange)


def attach(exchange: Forwarded, up: UpstreamConnection, reused: bool) -> None:
    """The pool gave ``exchange`` a connection: write the head and what of the body has arrived."""
    exchange.upstream = up
    exchange.reused = reused
    request = exchange.request
    assert request is not None
    client = exchange.client
    if client.write_paused:
        up.transport.pause_reading()
    head = request.head
    body = exchange.body
    pending = None
    if exchange.ws_key is not None:
        head = websocket_request(head)
    elif body is not None:
        pending = body.take_pending()
        if pending:
            head += b"".join(pending)
    up.start(exchange, head)
    if pending:
        client.resume_reading(PENDING)


def retry(exchange: Forwarded) -> bool:
    """The connection was lost before any answer: a pooled one the model server had closed is worth
    one retry on a fresh one, for a request that can be sent again."""
    if exchange.reused and not exchange.retried and retryable(exchange.method, exchange.request):
        exchange.retried = True
        pool = exchange.dest.pool
        assert pool is not None
        pool.acquire(exchange)
        return True
    return False


class RequestBody:
    """One request's body, forwarded as it arrives (while its exchange has not dropped it)."""

    __slots__ = ("chunked", "pending", "pending_size", "seen")

    def __init__(self, chunked: bool) -> None:
        self.chunked = chunked
        """The client's body is chunked (re-chunked upstream)."""
        self.pending: list[bytes] | None = None
        """What arrived before the upstream connection did."""
        self.pending_size = 0
        self.seen = 0
        """Bytes received so far (bounded by ``--max-request-body-bytes``)."""

    def received(self, exchange: Forwarded, data: bytes) -> None:
        client = exchange.client
        self.seen += len(data)
        limit = client.listener.max_body
        if self.seen > limit:
            exchange.discard = True
            if exchange.head_sent:
                if client.transport is not None:
                    client.transport.abort()
                exchange.abort(Outcome.REJECTED)
            else:
                exchange.reply(answers.too_large(limit), Outcome.REJECTED, close=True)
            return
        self._send(exchange, b"%x\r\n%s\r\n" % (len(data), data) if self.chunked else data)

    def ended(self, exchange: Forwarded) -> None:
        if self.chunked:
            self._send(exchange, b"0\r\n\r\n")

    def take_pending(self) -> list[bytes] | None:
        """What arrived before the upstream connection, to go with the head."""
        pending, self.pending = self.pending, None
        self.pending_size = 0
        return pending

    def _send(self, exchange: Forwarded, data: bytes) -> None:
        up = exchange.upstream
        if up is not None and up.transport is not None:
            up.transport.write(data)
            return
        if self.pending is None:
            self.pending = [data]
        else:
            self.pending.append(data)
        self.pending_size += len(data)
        if self.pending_size > PENDING_BODY_BYTES:
            exchange.client.pause_reading(PENDING)
