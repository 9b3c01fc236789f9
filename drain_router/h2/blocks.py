"""Streams as the peer's frames find them, and header blocks: assembled from HEADERS and CONTINUATION,
decoded, and checked by RFC 9113 §8 the same way whichever block of a stream they are. Sans-IO.

Which block a stream is at decides its rules: a request's first block is a request head
(:func:`rules.request`), a response's a response head (informational ones are dropped), and every
later block must end the stream and is trailers (:func:`rules.trailers`); a second block that does
not end the stream is malformed. A malformed block resets its stream with PROTOCOL_ERROR and never
reaches the stream's handler; ``content-length`` is held against the DATA that follows (§8.1.1).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, TypeVar, cast

from drain_router.h2 import frames, hpackcache, sending
from drain_router.h2 import rules as r
from drain_router.h2.frames import H2Error
from drain_router.h2.rules import Budgets
from drain_router.h2.streams import (
    ACCEPT,
    CLOSED,
    HALF_CLOSED_REMOTE,
    IDLE,
    OPEN,
    VERDICTS,
    Closed,
    Exit,
    Handler,
    Headers,
    Stream,
    Verdict,
    received,
)

_ENDED, _EXIT_ENDED = Closed.ENDED, Exit.ENDED  # module globals: see streams.OPEN
T = TypeVar("T")


class Events(sending.Events, Protocol):
    def stream_requested(self, stream: Stream, headers: Headers, request: r.Request, end: bool) -> None:
        """A new stream's checked request head (server role): give it a handler, or refuse it."""

    def request_rejected(self) -> None:
        """A new stream's request head was malformed: it was reset and is never relayed."""


class Blocks(sending.Sender):
    def __init__(self, events: Events, *, client_side: bool, budgets: Budgets | None, max_backlog: int | None) -> None:
        super().__init__(events, client_side=client_side, max_backlog=max_backlog)
        self.block_events = events
        self.decoder = hpackcache.Decoder()
        self.block: tuple[int, int, bytearray, bool] | None = None
        """A header block being assembled: (stream, flags, bytes, depends on itself)."""
        self.next_stream = 1
        """The next stream id this end opens (client role)."""
        self.max_streams = r.MAX_CONCURRENT_STREAMS
        """Concurrent streams the peer may open (server role; advertised in SETTINGS)."""
        self.budgets = budgets or Budgets(0.0, limited=False)
        self.now = 0.0
        self.checked_lists: dict[int, tuple[Headers, object, object]] = {}
        """Header lists already checked, by identity (see :meth:`checked`)."""

    def spend(self, budget: r.Budget, what: str) -> None:
        """Pay for a frame that costs work without progress; past the budget, ENHANCE_YOUR_CALM."""
        if not budget.spend(self.now):
            raise H2Error(frames.ENHANCE_YOUR_CALM, f"too many {what}")

    def spend_idle(self, what: str) -> None:
        """Pay for a frame of :data:`rules.IDLE_FRAMES`: what the peer was relayed earns more of them."""
        streams = (self.last_peer_stream + 1) // 2
        earned = self.data_frames_sent * r.IDLE_FRAMES_PER_DATA_SENT + streams * r.IDLE_FRAMES_PER_STREAM
        if not self.budgets.idle.spend(self.now, earned):
            raise H2Error(frames.ENHANCE_YOUR_CALM, f"too many {what}")

    # -- which stream, and in which state -----------------------------------------------------------

    def stream_verdict(self, sid: int, kind: int) -> tuple[Stream | None, Verdict]:
        """The stream a frame is on (None: not on the connection) and what the frame does to it."""
        stream = self.streams.get(sid)
        if stream is not None:
            return stream, VERDICTS[id(stream.state)][kind]
        if sid == 0:
            raise H2Error(frames.PROTOCOL_ERROR, f"frame type {kind} on stream 0")
        own = (sid % 2 == 1) == self.client_side
        highest = self.next_stream - 2 if own else self.last_peer_stream
        if sid > highest:
            return None, received(IDLE, kind)
        how = self.closed.state(sid)
        if how is None:
            raise H2Error(frames.PROTOCOL_ERROR, f"stream {sid} was never opened")
        return None, received(how, kind)

    def judge(self, stream: Stream | None, sid: int, verdict: Verdict, what: str) -> bool:
        """Act on a verdict other than ACCEPT; True when the frame goes on to its stream."""
        if verdict is ACCEPT:
            return True
        if verdict is Verdict.STREAM_CLOSED:
            self.stream_error(stream, sid, frames.STREAM_CLOSED)
        elif verdict is Verdict.CONNECTION_STREAM_CLOSED:
            raise H2Error(frames.STREAM_CLOSED, f"{what} on a closed stream")
        elif verdict is Verdict.PROTOCOL_ERROR:
            raise H2Error(frames.PROTOCOL_ERROR, f"{what} on an idle stream")
        return False

    def stream_error(self, stream: Stream | None, sid: int, code: int, exit: Exit = Exit.VIOLATION) -> None:
        """RST_STREAM ``code`` for what the peer did on ``sid`` (§5.4.2); it counts as a reset."""
        self.spend(self.budgets.resets, "stream errors")
        if stream is not None:
            self.reset(stream, code, exit)
        else:
            self.control(frames.rst_stream(sid, code))

    # -- header blocks ----------------------------------------------------------------------------

    def headers_frame(self, flags: int, sid: int, payload: bytes) -> None:
        if sid == 0:
            raise H2Error(frames.PROTOCOL_ERROR, "HEADERS on stream 0")
        body = frames.strip_padding(flags, payload)
        if body is None:
            raise H2Error(frames.PROTOCOL_ERROR, "invalid padding")
        self_dependent = False
        if flags & frames.PRIORITY_FLAG:
            if len(body) < 5:
                raise H2Error(frames.FRAME_SIZE_ERROR, "HEADERS too short for its priority")
            self_dependent = int.from_bytes(body[:4], "big") & 0x7FFFFFFF == sid
            body = body[5:]
        if flags & frames.END_HEADERS:
            self.header_block(sid, flags, body, self_dependent)
        else:
            self.block = (sid, flags, bytearray(body), self_dependent)
            self.check_block_size(len(body))

    def continuation_frame(self, flags: int, sid: int, payload: bytes) -> None:
        block = self.block
        if block is None or block[0] != sid:
            raise H2Error(frames.PROTOCOL_ERROR, "CONTINUATION without its HEADERS")
        block[2].extend(payload)
        self.check_block_size(len(block[2]))
        if flags & frames.END_HEADERS:
            self.block = None
            self.header_block(sid, block[1], bytes(block[2]), block[3])

    def check_block_size(self, size: int) -> None:
        if size > r.MAX_HEADER_BLOCK_BYTES:
            raise H2Error(frames.ENHANCE_YOUR_CALM, "header block too large")

    def header_block(self, sid: int, flags: int, block: bytes, self_dependent: bool) -> None:
        try:
            headers = self.decoder.decode(block)  # always, even for a stream it is dropped on: HPACK's state
        except hpackcache.HeaderListTooLarge:
            raise H2Error(frames.ENHANCE_YOUR_CALM, "header list too large") from None
        except hpackcache.CompressionError:
            raise H2Error(frames.COMPRESSION_ERROR, "invalid header block") from None
        end = bool(flags & frames.END_STREAM)
        stream, verdict = self.stream_verdict(sid, frames.HEADERS)
        if stream is None and verdict is ACCEPT:
            self.new_stream(sid, headers, end, self_dependent)
            return
        if not self.judge(stream, sid, verdict, "HEADERS") or stream is None:
            return
        if self_dependent:
            self.stream_error(stream, sid, frames.PROTOCOL_ERROR)
            return
        try:
            if not self.later_block(stream, headers, end):
                return
        except r.Malformed:
            self.stream_error(stream, sid, frames.PROTOCOL_ERROR, Exit.MALFORMED)
            return
        self.deliver_headers(stream, headers, end)

    def later_block(self, stream: Stream, headers: Headers, end: bool) -> bool:
        """Check a block on a stream that is open: a response's head (client role) or trailers; False
        for an informational response (dropped). Raises :class:`rules.Malformed`."""
        if self.client_side and not stream.heads:
            status, length = self.checked(headers, r.response)
            if status < 200:
                if end:
                    raise r.Malformed("an informational response ends its stream")
                return False
            stream.heads = 1
            stream.body_left = length
        else:
            if not end:
                raise r.Malformed("a second header block that does not end the stream")
            self.checked(headers, r.trailers)
        if end and stream.body_left > 0:
            raise r.Malformed("the stream ended short of its content-length")
        return True

    def new_stream(self, sid: int, headers: Headers, end: bool, self_dependent: bool) -> None:
        """HEADERS on an idle stream: the client opens a stream (server role)."""
        if self.client_side:
            raise H2Error(frames.PROTOCOL_ERROR, "the model server opened a stream")
        if sid % 2 == 0:
            raise H2Error(frames.PROTOCOL_ERROR, "a client's stream ids are odd")
        self.last_peer_stream = sid
        stream = Stream(sid, None, self.peer_initial_window, r.STREAM_WINDOW)
        if end:
            stream.state = HALF_CLOSED_REMOTE
        self.streams[sid] = stream
        if self_dependent:
            self.stream_error(stream, sid, frames.PROTOCOL_ERROR)
            return
        try:
            request = self.checked(headers, r.request)
            if end and request.length > 0:
                raise r.Malformed("the stream ended short of its content-length")
        except r.Malformed:
            self.block_events.request_rejected()
            self.stream_error(stream, sid, frames.PROTOCOL_ERROR, Exit.MALFORMED)
            return
        stream.body_left = request.length
        self.block_events.stream_requested(stream, headers, request, end)

    def checked(self, headers: Headers, rule: Callable[[Headers], T]) -> T:
        """``rule(headers)``, remembered: a list decoded from a remembered block is the same object
        each time (never changed after decoding), so its check is remembered with it, held so its
        identity cannot be reused. Raises :class:`rules.Malformed` (never remembered)."""
        known = self.checked_lists.get(id(headers))
        if known is not None and known[0] is headers and known[1] is rule:
            return cast(T, known[2])
        result = rule(headers)
        if len(self.checked_lists) >= hpackcache.CACHE_ENTRIES:
            self.checked_lists.clear()
        self.checked_lists[id(headers)] = (headers, rule, result)
        return result

    def open_stream(self, handler: Handler, headers: Headers, end: bool) -> Stream:
        """A new stream carrying ``headers`` (client role)."""
        sid = self.next_stream
        self.next_stream += 2
        stream = Stream(sid, handler, self.peer_initial_window, r.STREAM_WINDOW)
        self.streams[sid] = stream
        self.send_headers(stream, headers, end)
        return stream

    def deliver_headers(self, stream: Stream, headers: Headers, end: bool) -> None:
        """Hand a checked block to the stream's handler; with END_STREAM the stream's state moves
        first, so the handler sees where it stands (a stream both ends have ended is never reset)."""
        if end:
            stream.state = HALF_CLOSED_REMOTE if stream.state is OPEN else CLOSED
            stream.handler.on_headers(stream, headers, end)
            if stream.state is CLOSED:
                self.close_stream(stream, _ENDED, _EXIT_ENDED, frames.NO_ERROR)
        else:
            stream.handler.on_headers(stream, headers, end)
