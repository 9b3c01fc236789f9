"""One proxied request, from its head parsed to the last byte of its response: counted exactly.

An :class:`Exchange` enters the in-flight count when it starts (at once for a request that has the
connection to itself, in its turn for a pipelined one) and leaves it exactly once
(:meth:`Exchange.finish`): when the last byte of its response is handed to the client's transport,
or when it is aborted (client gone, model server gone, deadline). Outcomes name the side that
failed: ``client_aborted`` when the client left, ``rejected`` for a request the router refuses,
``upstream_error`` only for the model server's failures, ``deadline_aborted`` for the deadline.

The request half: in its turn it takes a slot at its destination's gate (an admission
:class:`~drain_router.admission.ticket.Ticket`, with ``--max-concurrent-requests``) and is sent,
unless the router refuses it; its head and body go to the upstream connection the pool gives it
(:meth:`Exchange.attach`), the body re-chunked when the client's is chunked, bounded by
``--max-request-body-bytes`` and buffered (at most :data:`PENDING_BODY_BYTES`) while that connection
is still being opened (:class:`RequestBody`); sent once more, on a fresh connection, when the pooled
one it was given turns out closed.

The response half is relayed as it arrives, one client write per upstream read: a small body of
known length (:data:`~.heads.SMALL_BODY_BYTES`) with its head in one write; anything else streams,
re-chunked for HTTP/1.1 clients and close-delimited for HTTP/1.0 ones. An event stream's end is
watched as the OpenAI SDK reads it (:class:`~.sse.StreamEnd`): one that ends without its terminal
event, or is cut by the deadline, gets what :mod:`.sse` decides.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

from drain_router import logs, tracing
from drain_router.admission.gate import Gate
from drain_router.admission.ticket import Ticket
from drain_router.decisions import capacity, spans
from drain_router.decisions.capacity import Reason
from drain_router.http1 import answers, sse
from drain_router.http1.backpressure import PENDING, Reader
from drain_router.http1.heads import (
    CHUNKED,
    NONE,
    SMALL,
    RequestHead,
    client_head,
    interim_head,
    retryable,
    websocket_request,
)
from drain_router.http1.upstream.connection import UpstreamConnection
from drain_router.http1.upstream.pool import UpstreamPool
from drain_router.http1.websocket.tunnel import Tunnel
from drain_router.metrics import Metrics, Outcome
from drain_router.state import InFlight, RouterState

log = logs.get("drain_router.proxy")

COMPLETED = Outcome.COMPLETED
"""Bound once for the hot path: a global is read in nanoseconds, an enum member (on 3.11) in ~70."""
PATHS = sse.PATHS
KEEPS = sse.StreamEnd.keeps
"""A read that leaves a quick stream as it was (:meth:`~.sse.StreamEnd.keeps`), bound once."""
QUERY = ord("?")
"""``QUERY in target``: a byte's membership, ten times faster than a one-byte substring search."""

#: Request body bytes buffered while the upstream connection is being opened, before the client is
#: no longer read.
PENDING_BODY_BYTES = 64 * 1024

#: ``Exchange.truncated``: the stream ended without its terminal event; CUT: and the client
#: connection is to be cut (mid-event, a chunked body).
TRUNCATED, CUT = 1, 2


class Destination(Protocol):
    """Where a request goes, chosen once from its head: the admission gate it waits at and the pool
    it is forwarded through. The router's listener is its own; the activator picks one per service."""

    @property
    def gate(self) -> Gate | None: ...
    @property
    def pool(self) -> UpstreamPool | None:
        """None only while its gate holds every request (a service asleep)."""

    @property
    def host_header(self) -> bytes:
        """``Host`` for a request that came without one (HTTP/1.0)."""

    @property
    def refusal(self) -> answers.Error | None:
        """The answer instead of forwarding (the activator's: no service named, or none known)."""

    @property
    def exchange_type(self) -> type[Exchange]:
        """The class of its requests' exchanges: :class:`Exchange`, or the front's."""

    @property
    def traced_exchange_type(self) -> type[Exchange]:
        """The same with a span (``--tracing``): a :class:`~.traced.Traced` subclass."""


class Site(Protocol):
    """What every request of a listener shares (the traffic listener)."""

    @property
    def loop(self) -> asyncio.AbstractEventLoop: ...
    @property
    def inflight(self) -> InFlight: ...
    @property
    def metrics(self) -> Metrics: ...
    @property
    def max_body(self) -> int: ...
    @property
    def access_log(self) -> bool: ...
    @property
    def gate(self) -> Gate | None: ...
    @property
    def exempt_paths(self) -> frozenset[bytes]: ...
    @property
    def state(self) -> RouterState: ...


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
        "body",
        "body_at",
        "client",
        "close",
        "code",
        "dest",
        "discard",
        "end",
        "finished",
        "head_sent",
        "http10",
        "keep_alive",
        "method",
        "mode",
        "problem",
        "req_done",
        "request",
        "resp_done",
        "retried",
        "reused",
        "started",
        "started_at",
        "target",
        "ticket",
        "to_client",
        "truncated",
        "until_eof",
        "upstream",
        "ws_key",
    )

    def __init__(
        self,
        client: Client,
        dest: Destination,
        method: bytes,
        target: bytes,
        http10: bool,
        keep_alive: bool,
        request: RequestHead | None,
        problem: answers.Error | None,
    ) -> None:
        self.client = client
        self.dest = dest
        self.method = method
        self.target = target
        self.http10 = http10
        self.keep_alive = keep_alive
        self.request = request
        self.problem = problem
        """Why the router refuses it (answered in its turn), or None."""
        self.discard = request is None or problem is not None
        """Its body is read and dropped (a refused request's, or past a limit)."""
        self.body = (
            RequestBody(request.chunked)
            if request is not None and (request.chunked or request.content_length)
            else None
        )
        """Its body, forwarded as it arrives (None: it has none)."""
        self.req_done = False
        self.upstream: UpstreamConnection | None = None
        """The pooled connection it holds, from :meth:`attach` to its end."""
        self.reused = False
        self.retried = False
        self.code = 0
        self.mode = NONE
        self.until_eof = False
        self.resp_done = False
        self.to_client: list[bytes] = []
        """What one upstream read produced for the client: written in one write by :meth:`flush`."""
        self.body_at = 0
        """Where this read's body bytes start in ``to_client`` (after a head that came with them)."""
        self.end: sse.StreamEnd | None = None
        """An event stream's end, as the OpenAI SDK reads it (:meth:`watch`); None: not one."""
        self.truncated = 0
        """Ended without its terminal event: 0, :data:`TRUNCATED` or :data:`CUT`."""
        self.head_sent = False
        self.close = False
        self.finished = False
        self.started = False
        self.ticket: Ticket | None = None
        """Its place at the gate (with ``--max-concurrent-requests``), from its turn to its end."""
        self.started_at = 0.0
        """The loop time it entered the in-flight count (its duration and time to first byte)."""
        self.ws_key: bytes | None = None
        """A :class:`~drain_router.http1.handshake.Handshake`'s key (the 101 must answer it), else None."""

    @property
    def path(self) -> str:
        return self.target.partition(b"?")[0].decode("latin-1")

    def inflight_count(self) -> int:  # (for the pool's log)
        return len(self.client.listener.inflight)

    # -- the request ---------------------------------------------------------------------------

    def start(self) -> None:
        """Its turn has come (after the pipelined one ahead): it enters the count, or waits for a slot.
        One the router refuses anyway (a bad head) and a ``GET`` of an exempt path never take one."""
        listener = self.client.listener
        gate = self.dest.gate
        if (
            gate is not None
            and self.request is not None
            and self.problem is None
            and not capacity.exempt(self.method, self.target.partition(b"?")[0], listener.exempt_paths)
        ):
            ticket = self.ticket = Ticket(gate, self)
            if not ticket.admit():
                return  # it waits for a slot (it enters the count when given one), or was refused
        self.started = True
        self.started_at = listener.loop.time()
        listener.inflight.enter(self)
        self.send()

    # -- admission: what its ticket calls ------------------------------------------------------

    speaks_grpc = False

    def admitted(self) -> None:
        """Given a slot after waiting: it enters the count now and is sent in the next turn of the loop."""
        listener = self.client.listener
        self.started = True
        self.started_at = listener.loop.time()
        listener.inflight.enter(self)
        listener.loop.call_soon(self._send_in_turn)

    def _send_in_turn(self) -> None:
        if not self.finished:
            self.send()

    def refused(self, reason: Reason, retry_after: float) -> None:
        """The router's own answer: 429 or 503 (at closing with ``Connection: close``), with when to retry."""
        status, kind, message, close = capacity.HTTP_ANSWERS[reason]
        self.discard = True
        if reason is Reason.CLOSING:
            tracing.event(self, spans.REFUSED_CLOSING)
        extra = answers.retry_after(*capacity.headers(retry_after)) + answers.refused(kind)
        self._reply((status, kind, message), Outcome.REJECTED, close, extra)

    def answer(self, words: answers.Error) -> None:
        """Ended while it waited, with an answer of the activator's (no such service)."""
        self.discard = True
        self.reply(words, Outcome.REJECTED)

    # -- the request half ----------------------------------------------------------------------

    def send(self) -> None:
        """Refused (its head was, or it is past a limit), else handed to the pool (which gives it a
        connection: :meth:`attach`)."""
        client = self.client
        request = self.request
        if request is None or self.problem is not None:
            self.discard = True
            self.reply(self.problem or answers.BAD_REQUEST, Outcome.REJECTED, close=client.close_after)
            return
        if request.upgrade and self.ws_key is not None:
            client.close_after = True  # unless the upstream switches protocols
        elif request.upgrade:
            client.close_after = True
            self.discard = True
            self.reply(answers.UPGRADE, Outcome.REJECTED, close=True)
            return
        length = request.content_length
        limit = client.listener.max_body
        if length is not None and length > limit:
            self.discard = True
            self.reply(answers.too_large(limit), Outcome.REJECTED, close=True)
            return
        if request.expect_continue and not self.http10 and not self.req_done:
            client.transport.write(answers.CONTINUE)
        pool = self.dest.pool
        assert pool is not None  # (a destination has none only while its gate holds every request)
        pool.acquire(self)

    def attach(self, up: UpstreamConnection, *, reused: bool) -> None:
        """The pool gave it a connection: the head and what of the body has arrived go on it."""
        self.upstream = up
        self.reused = reused
        request = self.request
        assert request is not None
        client = self.client
        if client.write_paused:
            up.transport.pause_reading()
        head = request.head
        body = self.body
        pending = None
        if self.ws_key is not None:
            head = websocket_request(head)
        elif body is not None:
            pending = body.take_pending()
            if pending:
                head += b"".join(pending)
        up.start(self, head)
        if pending:
            client.resume_reading(PENDING)

    def retry(self) -> bool:
        """The connection was lost before any answer: a pooled one the model server had closed is
        worth one retry on a fresh one, for a request that can be sent again."""
        if self.reused and not self.retried and retryable(self.method, self.request):
            self.retried = True
            pool = self.dest.pool
            assert pool is not None
            pool.acquire(self)
            return True
        return False

    def request_body(self, data: bytes) -> None:
        if not (self.discard or self.finished) and self.body is not None:
            self.body.received(self, data)

    def request_done(self) -> None:
        self.req_done = True
        if not (self.discard or self.finished) and self.body is not None:
            self.body.ended(self)

    # -- the response (called from the upstream's parser callbacks, then flush()) --------------

    def response_interim(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        """A 1xx but 100 (``103 Early Hints``) goes to an HTTP/1.1 client only (RFC 9110 §15.2)."""
        if not self.http10:
            self.to_client.append(interim_head(status, headers))
            self.body_at = len(self.to_client)  # not body bytes

    def response_head(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        """The final response's head (raises :class:`~drain_router.http1.heads.BadFraming`: a 502)."""
        close = self.client.closes_after(self.keep_alive)
        head, mode, self.until_eof, self.close = client_head(
            status, headers, head_request=self.method == b"HEAD", http10=self.http10, close=close
        )
        self.code = status
        self.mode = mode
        target = self.target
        if mode != NONE and (target.endswith(PATHS) or (QUERY in target and sse.on_paths(target))):
            self.watch(status, headers)  # else surely not an event stream
        if self.request is not None:
            # Answered: the head is never sent again (a retry is only ever before an answer), so a
            # held stream does not keep it.
            self.request.head = b""
        out = self.to_client
        out.append(head)
        self.body_at = len(out)
        if mode == NONE:
            # Whole with its head (llhttp does not know a HEAD response has no body): whatever the
            # upstream sends after it is surplus.
            self.resp_done = True

    def watch(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        """A response to an OpenAI-style path: an event stream's end is watched (:class:`~.sse.StreamEnd`)."""
        kind = sse.kind(self.target, status, headers)
        self.end = sse.StreamEnd(kind) if kind else None

    def switch(self, up: UpstreamConnection, headers: list[tuple[bytes, bytes]], rest: bytes) -> None:
        """Only a :class:`~.handshake.Handshake` is switched (a 101 must answer its key)."""
        raise AssertionError("101 Switching Protocols for a request that is no WebSocket handshake")

    def flush(self) -> None:
        """After each upstream read: one write to the client; finish when the response is whole.
        The final head counts as sent (its status fixed) only once it is written."""
        if self.finished:
            return
        out = self.to_client
        if self.mode == CHUNKED:
            # What the read brought is one chunk, however many the model server framed (an event's
            # bytes are relayed as they came; only their framing is the router's own).
            at = self.body_at
            self.body_at = 0
            parts = len(out) - at
            end = self.end
            if parts == 1:
                body = out[at]
                # StreamEnd.keeps inlined: a read that leaves a quick stream as it was (the hot path:
                # two scans of its bytes in C, nothing stored).
                if end is not None and not (end.quick and body.endswith(b"\n\n") and body.find(b"[DONE]") < 0):
                    end.feed(body)
                out[at] = b"%x\r\n%s\r\n" % (len(body), body)
            elif parts > 1:
                if end is None:
                    size = sum(map(len, out[at:]))
                else:
                    # Several pieces (chunks llhttp handed over apart) are judged as one read: a
                    # terminal event may straddle two of them. One copy of the read, no call a piece.
                    body = b"".join(out[at:])
                    size = len(body)
                    del out[at:]
                    out.append(body)
                    if not (end.quick and KEEPS(body)):
                        end.feed(body)
                out.insert(at, b"%x\r\n" % size)
                out.append(b"\r\n")
            if self.resp_done:
                if end is None or end.ended_honestly():
                    out.append(sse.LAST_CHUNK)
                else:
                    self.truncate(end, out)
            elif not out:
                return
        else:
            if self.end is not None:
                self.track(self.end, out)
            if not self.resp_done and (not out or (self.mode == SMALL and not self.head_sent)):
                return
        transport = self.client.transport
        if transport is not None:
            transport.write(out[0] if len(out) == 1 else b"".join(out))
        out.clear()
        if not self.head_sent and self.code:
            self.head_sent = True
            listener = self.client.listener
            listener.metrics.ttfb.observe(listener.loop.time() - self.started_at)
        if self.resp_done:
            if self.truncated:
                # After the last write of a truncated stream: cut the client connection if it must
                # be, and count it the model server's failure.
                if self.truncated == CUT and transport is not None:
                    transport.abort()
                self.finish(Outcome.UPSTREAM_ERROR)
            else:
                self.finish(COMPLETED)

    def track(self, end: sse.StreamEnd, out: list[bytes]) -> None:
        """A read of a body that is not re-chunked (of known length, or close-delimited for an
        HTTP/1.0 client): its pieces watched, and a stream that ended without its terminal event
        told (:meth:`truncate`). A small body of known length waits whole in ``out`` for its one
        write: its pieces are watched once, when it is whole."""
        at = self.body_at
        if self.mode == SMALL:
            if not self.resp_done:
                return
            for piece in out[at:]:
                end.feed(piece)
        else:
            for piece in out[at:]:
                end.feed(piece)
            self.body_at = 0  # what this read brought is written now
        if self.resp_done and not end.ended_honestly():
            self.truncate(end, out)

    def truncate(self, end: sse.StreamEnd, out: list[bytes]) -> None:
        """The stream ended without its terminal event: what :func:`~.sse.truncated_end` says goes
        on ``out`` (this read's last bytes), and it is logged."""
        written, cut = sse.truncated_end(self.mode, end.at_boundary())
        self.truncated = CUT if cut else TRUNCATED
        out.append(written)
        log.warning("proxy.stream_truncated", path=self.path, status=self.code, error_event=bool(written), cut=cut)

    # -- endings -------------------------------------------------------------------------------

    def upstream_lost(self, exc: BaseException | None, *, invalid: bool = False) -> None:
        """The upstream connection closed (or sent something the router will not relay) while this
        exchange owned it. Until the final head is written the client can still be told with a 502."""
        self.upstream = None
        if self.finished:
            return
        if not invalid and exc is None and self.until_eof and self.code:
            self.resp_done = True  # a close-delimited body ends with the connection
            self.flush()
            return
        if not invalid and self.answered():
            # Its terminal event was relayed: the client has the whole answer, and gets its end.
            log.warning("proxy.upstream_cut_after_end", error=repr(exc), path=self.path)
            self.resp_done = True
            self.flush()
            return
        self.to_client.clear()
        self.body_at = 0
        if not self.code and not invalid and self.retry():
            return
        log.warning("proxy.upstream_invalid" if invalid else "proxy.upstream_cut", error=repr(exc), path=self.path)
        if not self.head_sent:
            self.reply(answers.BAD_RESPONSE if invalid else answers.CUT, Outcome.UPSTREAM_ERROR)
            return
        # The status went out and can no longer change: close the client connection without the
        # terminating chunk, so the client sees the stream cut.
        if self.client.transport is not None:
            self.client.transport.abort()
        self.finish(Outcome.UPSTREAM_ERROR)

    def answered(self) -> bool:
        """A chunked event stream whose relayed bytes (all written) end with its terminal event."""
        end = self.end
        return (
            end is not None and self.mode == CHUNKED and self.head_sent and not self.to_client and end.ended_honestly()
        )

    def fail(self, error: answers.Error, outcome: Outcome) -> None:
        """The upstream connection could not be opened: the model server never saw the request, and
        the answer says so (:func:`~.answers.refused`)."""
        if not self.finished:
            self.reply(error, outcome, extra=answers.refused(error[1]))

    def abort(self, outcome: Outcome) -> None:
        """Stop now: the upstream connection is closed, so the model server sees the request cancelled."""
        self.finish(outcome)  # (once: a finished exchange is not finished again)

    def abort_deadline(self) -> None:
        """The in-flight deadline: a stream first gets what :func:`~.sse.deadline_end` says."""
        if self.finished:
            return
        transport = self.client.transport
        end = self.end
        if end is not None and self.head_sent and transport is not None:
            transport.write(sse.deadline_end(self.mode, end.at_boundary()))
        self.finish(Outcome.DEADLINE_ABORTED)
        self.client.abort_for_deadline()

    def reply(self, error: answers.Error, outcome: Outcome, *, close: bool = False, extra: bytes = b"") -> None:
        """A JSON error of the router's own, written now (in-flight covers it); ``extra``: more header
        lines."""
        self._reply(error, outcome, close, extra)

    def _reply(self, error: answers.Error, outcome: Outcome, close: bool, extra: bytes) -> None:
        """:meth:`reply` with ``extra`` header lines (a refusal's, at the gate: its own span event)."""
        status, kind, message = error
        self.code = status
        client = self.client
        close = close or client.closes_after(self.keep_alive)
        self.close = close
        if client.transport is not None:
            client.transport.write(
                answers.error(
                    status,
                    kind,
                    message,
                    close=close,
                    keep_alive_10=self.http10,
                    head_only=self.method == b"HEAD",
                    extra=extra,
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
        ticket = self.ticket
        if ticket is not None:  # before it leaves the count: a waiter enters first
            ticket.leave(listener.loop.time() - self.started_at)
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
                **({"truncated": True} if self.truncated else {}),
            )
        up = self.upstream
        if up is not None:
            self.upstream = None
            completed = outcome == COMPLETED
            reusable = completed and up.keep_alive and self.req_done and not self.until_eof
            # A truncated stream's message was whole: its connection closes gracefully, not reused.
            up.pool.done_with(up, reusable, completed or bool(self.truncated), client.write_paused)
        client.exchange_finished(self, outcome)


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

    def received(self, exchange: Exchange, data: bytes) -> None:
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

    def ended(self, exchange: Exchange) -> None:
        if self.chunked:
            self._send(exchange, b"0\r\n\r\n")

    def take_pending(self) -> list[bytes] | None:
        """What arrived before the upstream connection, to go with the head."""
        pending, self.pending = self.pending, None
        self.pending_size = 0
        return pending

    def _send(self, exchange: Exchange, data: bytes) -> None:
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
