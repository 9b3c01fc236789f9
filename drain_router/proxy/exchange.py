"""One proxied request, from its head parsed to the last byte of its response: counted exactly.

An :class:`Exchange` enters the in-flight count when it starts (at once for a request that has the
connection to itself, in its turn for a pipelined one) and leaves it exactly once
(:meth:`Exchange.finish`): when the last byte of its response is handed to the client's transport,
or when it is aborted (client gone, model server gone, deadline). Outcomes name the side that
failed: ``client_aborted`` when the client left, ``rejected`` for a request the router refuses,
``upstream_error`` only for the model server's failures, ``deadline_aborted`` for the deadline.

The response is relayed as it arrives, one client write per upstream read: a small body of known
length (up to :data:`~drain_router.proxy.rewrite.SMALL_BODY_BYTES`) goes out with its head in one write; anything else streams,
re-chunked for HTTP/1.1 clients and close-delimited for HTTP/1.0 ones.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

from drain_router import logs
from drain_router.metrics import Metrics, Outcome
from drain_router.proxy import responses
from drain_router.proxy.backpressure import PENDING, Reader
from drain_router.proxy.pool import UpstreamPool
from drain_router.proxy.rewrite import (
    CHUNKED,
    NONE,
    SMALL,
    RequestHead,
    client_head,
    interim_head,
    retryable,
    switching_head,
    websocket_request,
)
from drain_router.proxy.state import InFlight
from drain_router.proxy.tunnel import Tunnel
from drain_router.proxy.upstream import UpstreamConnection

log = logs.get("drain_router.proxy")

#: Request body bytes buffered while the upstream connection is being opened, before the client is
#: no longer read.
PENDING_BODY_BYTES = 64 * 1024

COMPLETED = Outcome.COMPLETED
"""Bound once for the hot path: a global is read in nanoseconds, an enum member (on 3.11) in ~70."""


class Site(Protocol):
    """What every request of a listener shares (the traffic listener)."""

    @property
    def loop(self) -> asyncio.AbstractEventLoop: ...
    @property
    def inflight(self) -> InFlight: ...
    @property
    def pool(self) -> UpstreamPool: ...
    @property
    def metrics(self) -> Metrics: ...
    @property
    def max_body(self) -> int: ...
    @property
    def access_log(self) -> bool: ...


class Client(Reader, Protocol):
    """The client connection a request came on, as the request acts on it."""

    transport: Any
    """None once the connection is gone."""
    close_after: bool
    """The connection closes after the response being written."""

    @property
    def listener(self) -> Site: ...
    @property
    def write_paused(self) -> bool: ...
    @property
    def peer(self) -> bytes: ...
    @property
    def tunnel(self) -> Tunnel | None: ...

    def closes_after(self, keep_alive: bool) -> bool: ...
    def open_tunnel(self, up: UpstreamConnection, early_down: bytes) -> None: ...
    def abort_for_deadline(self) -> None: ...
    def exchange_finished(self, exchange: Exchange, outcome: Outcome) -> None: ...


class Exchange:
    __slots__ = (
        "body_seen",
        "chunked",
        "client",
        "close",
        "code",
        "discard",
        "finished",
        "head_sent",
        "http10",
        "keep_alive",
        "method",
        "mode",
        "pending",
        "pending_size",
        "problem",
        "req_done",
        "request",
        "resp_done",
        "retried",
        "reused",
        "started",
        "started_at",
        "target",
        "to_client",
        "until_eof",
        "upstream",
        "ws_key",
    )

    def __init__(
        self,
        client: Client,
        method: bytes,
        target: bytes,
        http10: bool,
        keep_alive: bool,
        request: RequestHead | None,
        problem: responses.Error | None,
    ) -> None:
        self.client = client
        self.method = method
        self.target = target
        self.http10 = http10
        self.keep_alive = keep_alive
        self.request = request
        self.problem = problem
        """Why the router refuses it (answered in its turn), or None."""
        self.chunked = request is not None and request.chunked
        """The client's body is chunked (re-chunked upstream)."""
        self.upstream: UpstreamConnection | None = None
        """The pooled connection it holds, from :meth:`attach` to :meth:`finish`."""
        self.pending: list[bytes] | None = None
        self.pending_size = 0
        self.req_done = False
        self.body_seen = 0
        """Request body bytes received so far (bounded by ``--max-request-body-bytes``)."""
        self.discard = request is None or problem is not None  # a refused request's body is dropped
        self.code = 0
        self.mode = NONE
        self.until_eof = False
        self.resp_done = False
        self.to_client: list[bytes] = []
        """What one upstream read produced for the client: written in one write by :meth:`flush`."""
        self.head_sent = False
        self.close = False
        self.finished = False
        self.reused = False
        self.retried = False
        self.started = False
        self.started_at = 0.0
        """The loop time it entered the in-flight count (its duration and time to first byte)."""
        self.ws_key: bytes | None = None
        """A WebSocket handshake's ``Sec-WebSocket-Key`` (the 101 must answer it), else None."""

    @property
    def path(self) -> str:
        return self.target.partition(b"?")[0].decode("latin-1")

    def inflight_count(self) -> int:
        return len(self.client.listener.inflight)

    # -- the request ---------------------------------------------------------------------------

    def start(self) -> None:
        """Its turn has come (pipelined requests wait for the one ahead): it enters the in-flight
        count, and is refused or sent."""
        listener = self.client.listener
        self.started = True
        self.started_at = listener.loop.time()
        listener.inflight.enter(self)
        request = self.request
        if request is None or self.problem is not None:
            self.discard = True
            self.reply(self.problem or responses.BAD_REQUEST, Outcome.REJECTED, close=self.client.close_after)
            return
        length = request.content_length
        if request.upgrade and self.ws_key is not None:
            self.client.close_after = True  # unless the upstream switches protocols
        elif request.upgrade:
            self.client.close_after = True
            self.discard = True
            self.reply(responses.UPGRADE, Outcome.REJECTED, close=True)
            return
        limit = listener.max_body
        if length is not None and length > limit:
            self.discard = True
            self.reply(responses.too_large(limit), Outcome.REJECTED, close=True)
            return
        if request.expect_continue and not self.http10 and not self.req_done:
            self.client.transport.write(responses.CONTINUE)
        listener.pool.acquire(self)

    def attach(self, up: UpstreamConnection, *, reused: bool) -> None:
        """The pool gave it a connection: write the head and what of the body has arrived."""
        self.upstream = up
        self.reused = reused
        assert self.request is not None
        if self.client.write_paused:
            up.transport.pause_reading()
        if self.ws_key is not None:
            up.start(self, websocket_request(self.request.head))
            return
        pending = self.pending
        if pending:
            self.pending = None
            self.pending_size = 0
            up.start(self, self.request.head + b"".join(pending))
            self.client.resume_reading(PENDING)
        else:
            up.start(self, self.request.head)

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

    # -- the response (called from the upstream's parser callbacks, then flush()) --------------

    def response_interim(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        """A 1xx other than 100 (``103 Early Hints``): relayed to an HTTP/1.1 client ahead of the
        final response (RFC 9110 §15.2); an HTTP/1.0 client cannot be sent one."""
        if not self.http10:
            self.to_client.append(interim_head(status, headers))

    def response_head(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        """The final response's head (raises :class:`~drain_router.proxy.rewrite.BadFraming`: a 502)."""
        close = self.client.closes_after(self.keep_alive)
        head, mode, self.until_eof, self.close = client_head(
            status, headers, head_request=self.method == b"HEAD", http10=self.http10, close=close
        )
        self.code = status
        self.mode = mode
        self.to_client.append(head)
        if mode == NONE:
            # Whole with its head (llhttp does not know a HEAD response has no body): whatever the
            # upstream sends after it is surplus.
            self.resp_done = True

    def switch(self, up: UpstreamConnection, headers: list[tuple[bytes, bytes]], rest: bytes) -> None:
        """The upstream's 101 answered this WebSocket handshake: relay it, and tunnel both
        connections from here on (``rest``: what the upstream sent after it in the same read)."""
        client = self.client
        self.code = 101
        self.upstream = None
        if client.transport is None:
            self.finish(Outcome.CLIENT_ABORTED)
            up.transport.abort()
            return
        client.transport.write(switching_head(headers))
        self.head_sent = True
        listener = client.listener
        listener.metrics.ttfb.observe(listener.loop.time() - self.started_at)
        client.open_tunnel(up, rest)

    def response_body(self, body: bytes) -> None:
        if self.mode == CHUNKED:
            self.to_client.append(b"%x\r\n%s\r\n" % (len(body), body))
        elif self.mode != NONE:
            self.to_client.append(body)

    def flush(self) -> None:
        """After each upstream read: one write to the client; finish when the response is whole.
        The final head counts as sent (its status fixed) only once it is written."""
        if self.finished:
            return
        out = self.to_client
        if self.resp_done:
            if self.mode == CHUNKED:
                out.append(b"0\r\n\r\n")
        elif not out or (self.mode == SMALL and not self.head_sent):
            return
        transport = self.client.transport
        if transport is not None:
            transport.write(out[0] if len(out) == 1 else b"".join(out))
        out.clear()
        if self.code and not self.head_sent:
            self.head_sent = True
            listener = self.client.listener
            listener.metrics.ttfb.observe(listener.loop.time() - self.started_at)
        if self.resp_done:
            self.finish(COMPLETED)

    # -- endings -------------------------------------------------------------------------------

    def upstream_lost(self, exc: BaseException | None, *, invalid: bool = False) -> None:
        """The upstream connection closed (or sent something the router will not relay) while this
        owned it. Until the final head is written the client can still be told with a 502."""
        self.upstream = None
        if self.finished:
            return
        if not invalid and exc is None and self.until_eof and self.code:
            self.resp_done = True  # a close-delimited body ends with the connection
            self.flush()
            return
        self.to_client.clear()
        if self.reused and not self.retried and not self.code and not invalid and retryable(self.method, self.request):
            # A pooled connection the model server had closed before any answer: one retry on a
            # fresh one.
            self.retried = True
            self.client.listener.pool.acquire(self)
            return
        log.warning("proxy.upstream_invalid" if invalid else "proxy.upstream_cut", error=repr(exc), path=self.path)
        if not self.head_sent:
            self.reply(responses.BAD_RESPONSE if invalid else responses.CUT, Outcome.UPSTREAM_ERROR)
            return
        # The status went out and can no longer change: close the client connection without the
        # terminating chunk, so the client sees the stream cut.
        if self.client.transport is not None:
            self.client.transport.abort()
        self.finish(Outcome.UPSTREAM_ERROR)

    def fail(self, error: responses.Error, outcome: Outcome) -> None:
        """The upstream connection could not be opened."""
        if not self.finished:
            self.reply(error, outcome)

    def abort(self, outcome: Outcome) -> None:
        """Stop now: the upstream connection is closed, so the model server sees the request cancelled."""
        if not self.finished:
            self.finish(outcome)

    def abort_deadline(self) -> None:
        tunnel = self.client.tunnel
        if tunnel is not None and not self.finished and self.code == 101:
            tunnel.going_away(Outcome.DEADLINE_ABORTED)  # Close 1001 both ways; it finishes when they are done
            return
        if not self.finished:
            self.finish(Outcome.DEADLINE_ABORTED)
            self.client.abort_for_deadline()

    def reply(self, error: responses.Error, outcome: Outcome, *, close: bool = False) -> None:
        """A JSON error of the router's own, written now (in-flight covers it)."""
        status, kind, message = error
        self.code = status
        client = self.client
        close = close or client.closes_after(self.keep_alive)
        self.close = close
        if client.transport is not None:
            client.transport.write(
                responses.error(
                    status, kind, message, close=close, keep_alive_10=self.http10, head_only=self.method == b"HEAD"
                )
            )
        self.head_sent = True
        self.finish(outcome)

    def finish(self, outcome: Outcome) -> None:
        """Leave the in-flight count (exactly once), release or close the upstream connection, and
        let the client connection go on."""
        if self.finished:
            return
        self.finished = True
        client = self.client
        listener = client.listener
        duration = 0.0
        if self.started:
            listener.inflight.leave(self)
            duration = listener.loop.time() - self.started_at
        code = self.code if self.head_sent else 0  # the status the client received, if any
        listener.metrics.count_request(code, outcome, duration)
        if listener.access_log:
            log.info(
                "request",
                method=self.method.decode("latin-1"),
                path=self.path,
                status=code,
                outcome=outcome,
                duration_s=round(duration, 6),
                remote=client.peer.decode("latin-1"),
            )
        up = self.upstream
        if up is not None:
            self.upstream = None
            reusable = outcome == COMPLETED and up.keep_alive and self.req_done and not self.until_eof
            if reusable and up.transport is not None and not up.transport.is_closing():
                if client.write_paused:
                    up.transport.resume_reading()
                listener.pool.release(up)
            else:
                up.exchange = None
                if up.transport is not None:
                    # Closing an unfinished response's connection: the model server sees the
                    # request cancelled and stops generating.
                    if outcome == COMPLETED:
                        up.transport.close()
                    else:
                        up.transport.abort()
        client.exchange_finished(self, outcome)
