"""One proxied request, from its head parsed to the last byte of its response: counted exactly.

An :class:`Exchange` enters the in-flight count when it starts (at once for a request that has the
connection to itself, in its turn for a pipelined one) and leaves it exactly once
(:meth:`Exchange.finish`): when the last byte of its response is handed to the client's transport,
or when it is aborted (client gone, model server gone, deadline). Outcomes name the side that
failed: ``client_aborted`` when the client left, ``rejected`` for a request the router refuses,
``upstream_error`` only for the model server's failures, ``deadline_aborted`` for the deadline.

It goes to its destination's gate and pool (:class:`~.roles.Destination`: the listener's, or a
service's). The response is relayed as it arrives, one client write per upstream read: a small body
of known length (:data:`~.heads.SMALL_BODY_BYTES`) with its head in one write; anything else
streams, re-chunked for HTTP/1.1 clients and close-delimited for HTTP/1.0 ones.
"""

from __future__ import annotations

from drain_router.http1 import answers, forwarding, relaying, slots, sse
from drain_router.http1.heads import CHUNKED, NONE, SMALL, RequestHead, client_head, interim_head
from drain_router.http1.roles import Client, Destination
from drain_router.http1.upstream.connection import UpstreamConnection
from drain_router.metrics import Outcome

COMPLETED = Outcome.COMPLETED
"""Bound once for the hot path: a global is read in nanoseconds, an enum member (on 3.11) in ~70."""
PATHS = sse.PATHS
SHORT = sse.SHORT
LARGEST = sse.LARGEST


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
        "gated",
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
        self.body = forwarding.body_of(request)
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
        """An event stream's end, as the OpenAI SDK reads it (:func:`~.relaying.watch`); None: not one."""
        self.truncated = 0
        """Ended without its terminal event: 0, :data:`~.relaying.TRUNCATED` or :data:`~.relaying.CUT`."""
        self.head_sent = False
        self.close = False
        self.finished = False
        self.started = False
        self.gated: object = None  # see slots.Gated
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
        """Its turn has come (after the pipelined one ahead): it enters the count, or waits for a slot."""
        gate = self.dest.gate
        if gate is not None and not slots.admit(self, gate):
            return  # it waits for a slot (it enters the count when given one), or was refused
        listener = self.client.listener
        self.started = True
        self.started_at = listener.loop.time()
        listener.inflight.enter(self)
        forwarding.send(self)

    def attach(self, up: UpstreamConnection, *, reused: bool) -> None:
        """The pool gave it a connection: the head and what of the body has arrived go on it."""
        forwarding.attach(self, up, reused)

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
        if mode != NONE and (target.endswith(PATHS) or (b"?" in target and sse.on_paths(target))):
            relaying.watch(self, status, headers)  # else surely not an event stream
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
                size = len(body)
                if end is not None:
                    if end.fast and SHORT <= size <= LARGEST:
                        end.prev = end.last  # references: no copy on the hot path
                        end.last = body
                        end.seen += size
                    else:
                        end.feed(out, at)
                out[at] = b"%x\r\n%s\r\n" % (size, body)
            elif parts > 1:
                size = sum(map(len, out[at:]))
                if end is not None:
                    prev, last = out[-2], out[-1]
                    if end.fast and SHORT <= len(prev) <= LARGEST and SHORT <= len(last) <= LARGEST:
                        end.prev = prev  # the read's last two events, by reference
                        end.last = last
                        end.seen += size
                    else:
                        end.feed(out, at)
                out.insert(at, b"%x\r\n" % size)
                out.append(b"\r\n")
            if self.resp_done:
                if end is not None:
                    relaying.last_chunk(self, end, out)
                else:
                    out.append(sse.LAST_CHUNK)
            elif not out:
                return
        else:
            if self.end is not None:
                relaying.track(self, self.end, out)
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
                relaying.end_truncated(self)
            else:
                self.finish(COMPLETED)

    # -- endings -------------------------------------------------------------------------------

    def upstream_lost(self, exc: BaseException | None, *, invalid: bool = False) -> None:
        relaying.upstream_lost(self, exc, invalid)

    def fail(self, error: answers.Error, outcome: Outcome) -> None:
        """The upstream connection could not be opened."""
        if not self.finished:
            self.reply(error, outcome)

    def abort(self, outcome: Outcome) -> None:
        """Stop now: the upstream connection is closed, so the model server sees the request cancelled."""
        self.finish(outcome)  # (once: a finished exchange is not finished again)

    def abort_deadline(self) -> None:
        if not self.finished:
            relaying.deadline(self)
            self.finish(Outcome.DEADLINE_ABORTED)
            self.client.abort_for_deadline()

    def reply(self, error: answers.Error, outcome: Outcome, *, close: bool = False) -> None:
        relaying.reply(self, error, outcome, close)

    def finish(self, outcome: Outcome) -> None:
        """Leave the in-flight count (exactly once), release or close the upstream connection, and
        let the client connection go on."""
        if self.finished:
            return
        self.finished = True
        client = self.client
        listener = client.listener
        duration = 0.0
        if self.gated is not None:
            slots.leave(self)  # before it leaves the count: a waiter enters first
        if self.started:
            listener.inflight.leave(self)
            duration = listener.loop.time() - self.started_at
        code = self.code if self.head_sent else 0  # the status the client received, if any
        listener.metrics.count_request(code, outcome, duration)
        if listener.access_log:
            relaying.log_request(self, code, outcome, duration)
        up = self.upstream
        if up is not None:
            self.upstream = None
            completed = outcome == COMPLETED
            reusable = completed and up.keep_alive and self.req_done and not self.until_eof
            # A truncated stream's message was whole: its connection closes gracefully, not reused.
            up.pool.done_with(up, reusable, completed or bool(self.truncated), client.write_paused)
        client.exchange_finished(self, outcome)
