"""Reading requests from a client connection: llhttp's strict parsing (no smuggling through both
Content-Length and Transfer-Encoding, no bare LF), the head limits and the verdict on each head
(:mod:`.classify`), and each head's exchange, started at once or left waiting for its turn
(:mod:`.pipeline`). A :class:`RequestReader` is what llhttp calls back on: each
:class:`~drain_router.http1.client.ClientConnection` holds one, and answers what it reads in order;
what the reader needs from its connection is declared here (:class:`Connection`).

A malformed request is answered in its turn (:meth:`RequestReader.bad_request`); nothing after it,
or after one that closes the connection, is parsed.
"""

from __future__ import annotations

from typing import Protocol

import httptools

from drain_router import logs, tracing
from drain_router.http1 import answers, traced
from drain_router.http1.backpressure import PIPELINE
from drain_router.http1.classify import MAX_HEAD_BYTES, MAX_HEADERS, MAX_LINE_BYTES, HeadTooLarge, admit, probe_path
from drain_router.http1.exchange import Client, Destination, Exchange, Site
from drain_router.http1.handshake import Handshake
from drain_router.http1.heads import Headers
from drain_router.http1.pipeline import HEAD_END, Pipeline, enqueue, feed_heads
from drain_router.metrics import Outcome

log = logs.get("drain_router.proxy")


class Sites(Protocol):
    """A listener's destinations when requests name where they go (the activator's services)."""

    def pick(self, headers: Headers) -> Destination: ...


class Reading(Site, Destination, Protocol):
    """The traffic listener, as reading requests uses it (:mod:`.reader`): the destination of
    every request unless it has :class:`Sites`."""

    @property
    def sites(self) -> Sites | None: ...

    @property
    def tracer(self) -> tracing.Tracer | None: ...

    @property
    def header_timeout(self) -> float: ...
    @property
    def bad_target_log(self) -> logs.RateLimited: ...
    @property
    def bad_request_log(self) -> logs.RateLimited: ...


class Connection(Client, Protocol):
    """The client connection a reader reads for, as reading acts on it."""

    active: Exchange | None
    """The exchange whose response is being relayed (the next parsed one waits for its turn)."""
    deadline: float | None
    """When the head being read (or the keep-alive wait) times out."""
    deadline_is_head: bool

    @property
    def listener(self) -> Reading: ...
    @property
    def peer_node(self) -> bytes: ...

    def answer_probe(self, path: bytes, method: bytes, keep_alive: bool, http10: bool) -> None: ...
    def close(self) -> None: ...


class RequestReader:
    """What llhttp parses on one client connection becomes exchanges, started at once or queued for
    their turn; the connection answers them (the reader reads, the connection writes)."""

    __slots__ = (
        "body_left",
        "conn",
        "current",
        "dropped",
        "head_bytes",
        "head_size",
        "headers",
        "in_head",
        "input_closed",
        "keep_alive",
        "parser",
        "queue",
        "starting",
        "unparsed",
        "upgrading",
        "url",
        "ws_early",
    )

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.parser = httptools.HttpRequestParser(self)
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.head_bytes = 0
        """Bytes received while a head is incomplete (bounds a head that never ends)."""
        self.head_size = 0
        """The parsed head's size so far."""
        self.in_head = True
        self.body_left = 0
        """Bytes of the Content-Length body being parsed still to come (no head can start in them)."""
        self.keep_alive = True
        """The request being parsed lets the connection be kept."""
        self.current: Exchange | None = None
        """The exchange whose request body is being parsed."""
        self.queue: Pipeline | None = None
        """Parsed requests waiting for their turn."""
        self.unparsed = b""
        """What the client sent after the requests waiting in the queue, parsed once one starts."""
        self.starting: Exchange | None = None
        """The exchange to start once the read being parsed is parsed whole."""
        self.input_closed = False
        """No more requests are parsed: after one that closes the connection, or a malformed one."""
        self.dropped = False
        """Input was dropped unparsed: closing needs a lingering close, or the answer may be reset."""
        self.upgrading: Exchange | None = None
        """The WebSocket handshake just parsed (what follows it in the read is held for it)."""
        self.ws_early = b""
        """What the client sent after its WebSocket handshake, before the 101 (one read at most)."""

    def stop(self) -> bytes:
        """The connection became a WebSocket tunnel: no HTTP is parsed on it again, so the parser
        (and the parsed head) go, which is most of what an idle session would otherwise hold.
        Returns what the client sent after its handshake (to go to the upstream after the 101)."""
        del self.parser
        self.headers = []
        early, self.ws_early = self.ws_early, b""
        return early

    def received(self, data: bytes, resumed: bool = False) -> None:
        """Feed ``data`` to llhttp, then start the request that came first. A read that may hold
        more than one request head is fed one head at a time (:func:`~.pipeline.feed_heads`).
        ``resumed``: ``data`` is what waited in ``unparsed`` (already counted)."""
        end = len(data)
        if not resumed:
            if self.input_closed:
                self.dropped = True  # after the last request, or lingering: read and dropped
                return
            if self.unparsed:  # reading was paused for the queue; keep the order
                self.unparsed += data
                return
            if self.in_head:
                self.head_bytes += end
        try:
            # Where the first head in the read ends (-1: none does); the rest of a Content-Length
            # body is not searched (find starts past it, and past the end finds nothing at once).
            cut = data.find(HEAD_END, self.body_left)
            if (cut < 0 or cut + 4 == end) and not self.queue:  # at most one head, nothing waiting: the usual read
                self.parser.feed_data(data)
            else:
                feed_heads(self, data, cut + 4)
        except httptools.HttpParserUpgrade as exc:
            # Answered 501 (or 400 for CONNECT) in turn; nothing after it is parsed. A WebSocket
            # handshake is forwarded: what followed it in this read is held (reading pauses here,
            # so one read at most) and goes to the upstream after its 101.
            self.input_closed = self.dropped = True
            self.conn.pause_reading(PIPELINE)
            if self.upgrading is not None:
                self.ws_early = data[exc.args[0] :]
                self.upgrading = None
            if self.current is not None:
                self.current.req_done = True
                self.current = None
        except httptools.HttpParserCallbackError as exc:
            if isinstance(exc.__context__, HeadTooLarge):
                self.bad_request(answers.HEAD_TOO_LARGE, "head too large")
            else:  # a bug of ours, raised in a callback: say so loudly, and end this connection
                log.error("proxy.internal_error", error=repr(exc.__context__), exc_info=exc.__context__)
                if self.conn.transport is not None:
                    self.conn.transport.abort()
                return
        except httptools.HttpParserError as exc:
            if self.input_closed:
                self.dropped = True  # bytes after a request that closes the connection: not a request
            else:
                self.bad_request(answers.BAD_REQUEST, str(exc))
        else:
            if self.in_head and self.head_bytes > MAX_HEAD_BYTES and not self.input_closed:
                self.bad_request(answers.HEAD_TOO_LARGE, "head too large")
        if self.starting is not None:
            exchange, self.starting = self.starting, None
            if not exchange.finished:
                exchange.start()

    def on_message_begin(self) -> None:
        self.url = b""
        if self.headers:  # a chunked body's trailers (a head's list is let go once it is admitted)
            self.headers = []
        self.head_size = 0
        conn = self.conn
        if not conn.deadline_is_head or conn.deadline is None:
            listener = conn.listener
            conn.deadline = listener.loop.time() + listener.header_timeout
            conn.deadline_is_head = True

    def on_url(self, url: bytes) -> None:
        self.url += url
        if len(self.url) > MAX_LINE_BYTES:
            raise HeadTooLarge

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))
        size = len(name) + len(value)
        self.head_size += size + 4
        if size > MAX_LINE_BYTES or self.head_size > MAX_HEAD_BYTES or len(self.headers) > MAX_HEADERS:
            raise HeadTooLarge

    def on_headers_complete(self) -> None:
        self.in_head = False
        self.head_bytes = 0
        conn = self.conn
        conn.deadline = None
        parser = self.parser
        method = parser.get_method()
        version = parser.get_http_version()
        self.keep_alive = parser.should_keep_alive()
        url = self.url
        probe = probe_path(method, url, version)
        if probe is not None:
            entry = (probe, method, self.keep_alive, version == "1.0")
            self.current = None
            if conn.active is None and not self.queue:
                conn.answer_probe(*entry)
            else:
                enqueue(self, entry)
            return
        listener = conn.listener
        tracer = listener.tracer  # (--tracing: None when off)
        sites = listener.sites  # (None: the router's listener is every request's destination)
        dest = listener if sites is None else sites.pick(self.headers)
        verdict = admit(
            method, url, version, self.headers, conn.peer, conn.peer_node, dest.host_header, tracer is not None
        )
        if sites is not None and verdict.problem is None and dest.refusal is not None:
            verdict.problem, verdict.ws_key = dest.refusal, None  # refused in its turn, never held
        request, problem, ws_key = verdict.request, verdict.problem, verdict.ws_key
        if request is not None:
            self.body_left = request.content_length or 0
        if problem is answers.BAD_TARGET:
            listener.bad_target_log.emit(method=method.decode("latin-1"), target=url[:120].decode("latin-1"))
        if verdict.close:
            self.keep_alive = False
        http10 = version == "1.0"
        if tracer is not None:
            exchange = traced.exchange(tracer, conn, dest, method, url, version, self.keep_alive, verdict, self.headers)
            self.upgrading = exchange if exchange.ws_key is not None else self.upgrading
        elif ws_key is None or request is None:
            exchange = dest.exchange_type(conn, dest, method, url, http10, self.keep_alive, request, problem)
        else:
            exchange = self.upgrading = Handshake(conn, dest, method, url, http10, self.keep_alive, request, ws_key)
        self.headers = []  # admitted: a held stream keeps the head it sent upstream, not the parsed one
        self.current = exchange
        if conn.active is None and not self.queue:
            # Started once this read is parsed whole: a request whose body turns out malformed in
            # the same read never reaches the model server, and a body that came along is sent
            # with the head in one write.
            conn.active = self.starting = exchange
        else:
            enqueue(self, exchange)

    def on_body(self, body: bytes) -> None:
        if self.body_left:
            self.body_left -= len(body)
        if self.current is not None:
            self.current.request_body(body)

    def on_message_complete(self) -> None:
        self.in_head = True
        self.body_left = 0
        if not self.keep_alive:
            self.input_closed = True  # nothing after a request that closes the connection is a request
        exchange = self.current
        self.current = None
        if exchange is not None:
            exchange.request_done()
            if exchange.finished and self.input_closed and self.conn.active is None:
                self.conn.close()  # the rest of a refused body has been read: the answer is safe

    def bad_request(self, error: answers.Error, reason: str) -> None:
        """The client sent something llhttp (or the head limit) refuses. The requests before it are
        answered in order, then this error in its turn, and then the connection closes; nothing
        after it is parsed."""
        conn = self.conn
        if conn.transport is None:
            return
        conn.listener.bad_request_log.emit(status=error[0], reason=reason[:120])
        self.input_closed = self.dropped = True
        self.unparsed = b""
        conn.pause_reading(PIPELINE)
        current = self.current
        self.current = None
        if current is None:  # a malformed head, or garbage between requests: a refusal of its own
            refusal = Exchange(conn, conn.listener, b"", b"", False, False, None, error)
            if conn.active is None and not self.queue:
                conn.active = refusal
                refusal.start()
            else:  # after the requests that came first (one of them may still be starting)
                enqueue(self, refusal)
            return
        # The malformed part is this request's body.
        current.req_done = True
        current.keep_alive = False
        if current is self.starting:
            self.starting = None
        if not current.started:
            current.problem = error  # refused in its turn: its head never reaches the model server
            current.discard = True
            if current is conn.active:
                current.start()
        elif not current.head_sent:
            current.discard = True
            current.reply(error, Outcome.REJECTED, close=True)
        else:  # its response is streaming already: the status can no longer change
            current.abort(Outcome.REJECTED)
            conn.transport.abort()
