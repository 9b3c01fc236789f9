"""The request half of an exchange: its head and body forwarded to the upstream connection the pool
gave it, re-chunked when the client's body is chunked, bounded by ``--max-request-body-bytes``, and
buffered (at most :data:`PENDING_BODY_BYTES`) while that connection is still being opened.
:class:`RequestForwarding` is the base of :class:`~drain_router.proxy.exchange.Exchange`."""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

from drain_router.metrics import Outcome
from drain_router.proxy import responses
from drain_router.proxy.backpressure import PENDING
from drain_router.proxy.rewrite import RequestHead, websocket_request
from drain_router.proxy.roles import Client
from drain_router.proxy.upstream import Owner, UpstreamConnection

#: Request body bytes buffered while the upstream connection is being opened, before the client is
#: no longer read.
PENDING_BODY_BYTES = 64 * 1024


class RequestForwarding:
    __slots__ = ("body_seen", "chunked", "discard", "pending", "pending_size", "req_done", "reused", "upstream")

    # The exchange's state and acts that forwarding uses.
    client: Client
    request: RequestHead | None
    ws_key: bytes | None
    finished: bool
    head_sent: bool
    abort: Callable[[Outcome], None]
    reply: Callable[..., None]

    def __init__(self, request: RequestHead | None, refused: bool) -> None:
        self.chunked = request is not None and request.chunked
        """The client's body is chunked (re-chunked upstream)."""
        self.upstream: UpstreamConnection | None = None
        """The pooled connection it holds, from :meth:`attach` to the exchange's end."""
        self.reused = False
        self.pending: list[bytes] | None = None
        self.pending_size = 0
        self.req_done = False
        self.body_seen = 0
        """Request body bytes received so far (bounded by ``--max-request-body-bytes``)."""
        self.discard = refused
        """Its body is read and dropped (a refused request's, or past a limit)."""

    def attach(self, up: UpstreamConnection, *, reused: bool) -> None:
        """The pool gave it a connection: write the head and what of the body has arrived."""
        self.upstream = up
        self.reused = reused
        assert self.request is not None
        if self.client.write_paused:
            up.transport.pause_reading()
        head = self.request.head
        pending = self.pending
        if self.ws_key is not None:
            head = websocket_request(head)
        elif pending:
            self.pending = None
            self.pending_size = 0
            head += b"".join(pending)
        # This class is only ever an Exchange's request half: the connection's owner is the exchange.
        up.start(cast(Owner, self), head)
        if pending and self.ws_key is None:
            self.client.resume_reading(PENDING)

    def request_body(self, data: bytes) -> None:
        if self.discard or self.finished:
            return
        self.body_seen += len(data)
        limit = self.client.listener.max_body
        if self.body_seen > limit:
            self.discard = True
            if self.head_sent:
                if self.client.transport is not None:
                    self.client.transport.abort()
                self.abort(Outcome.REJECTED)
            else:
                self.reply(responses.too_large(limit), Outcome.REJECTED, close=True)
            return
        framed = b"%x\r\n%s\r\n" % (len(data), data) if self.chunked else data
        self._send(framed)

    def request_done(self) -> None:
        self.req_done = True
        if self.discard or self.finished:
            return
        if self.chunked:
            self._send(b"0\r\n\r\n")

    def _send(self, data: bytes) -> None:
        up = self.upstream
        if up is not None and up.transport is not None:
            up.transport.write(data)
            return
        if self.pending is None:
            self.pending = [data]
        else:
            self.pending.append(data)
        self.pending_size += len(data)
        if self.pending_size > PENDING_BODY_BYTES:
            self.client.pause_reading(PENDING)
