"""One end of an HTTP/2 connection, sans-IO: bytes in (:meth:`Connection.receive`), events out to
each stream's :class:`~drain_router.h2.streams.Handler` and to the role above (:class:`Events`), and
bytes out, gathered for the I/O layer to take (:meth:`Connection.data_to_send`) when told there is
output (:meth:`Events.output_ready`).

One class, :class:`Connection`, holding its stateful collaborators by reference: the connection's
flow-control windows (:class:`~.windows.Windows`), its output (:class:`~.output.Output`), the peer's
header blocks as they arrive (:class:`~.blocks.HeaderBlocks`), the streams
(:class:`~.streams.Stream`, each with its own windows and what waits on it) and the closed streams
it remembers (:class:`~.streams.ClosedStreams`).

Every received frame is judged once: frames that belong to the connection here, frames on a stream
by RFC 9113 §5.1's table (:data:`~drain_router.h2.streams.RECEIVED`), then header blocks, once
assembled and decoded, by §8's rules, the same way whichever block of the stream they are. Which block a stream is at decides its
rules: a request's first block is a request head (:func:`rules.request`), a response's a response
head (informational ones are dropped), and every later block must end the stream and is trailers
(:func:`rules.trailers`); a second block that does not end the stream is malformed. A malformed
block resets its stream with PROTOCOL_ERROR and never reaches the stream's handler;
``content-length`` is held against the DATA that follows (§8.1.1; a response that has no content,
to a HEAD request or a 204 or 304, owes none: :func:`rules.content_owed`). Frames that cost work
without progress are paid from budgets (a client connection's; the model server's has none).

Flow control gives back-pressure both ways: DATA goes out within the peer's windows, the rest waits
on its stream (at most one stream window, since the other side's window is re-opened only for bytes
taken here); a stream's receive window is re-opened in batches as the other side takes its bytes
(:meth:`Connection.grant`). Output other than relayed DATA (control frames, header blocks) queued
while the transport is paused has a bound: past it the connection fails with ENHANCE_YOUR_CALM.

The peer's END_STREAM moves a stream one way (:meth:`Connection.end_received`), and a stream leaves
the connection one way (:meth:`Connection.close_stream`): its handler is told so exactly once, with
why.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, TypeVar

from drain_router.h2 import frames, hpackcache
from drain_router.h2 import rules as r
from drain_router.h2.blocks import HeaderBlocks
from drain_router.h2.frames import H2Error
from drain_router.h2.output import Output
from drain_router.h2.rules import Budgets
from drain_router.h2.streams import (
    ACCEPT,
    CLOSED,
    HALF_CLOSED_LOCAL,
    HALF_CLOSED_REMOTE,
    IDLE,
    OPEN,
    VERDICTS,
    Closed,
    ClosedStreams,
    Exit,
    Handler,
    Headers,
    Stream,
    Verdict,
    received,
)
from drain_router.h2.windows import ANNOUNCE_AT, Windows

_ENDED, _EXIT_ENDED = Closed.ENDED, Exit.ENDED  # module globals: see streams.OPEN
T = TypeVar("T")


class Events(Protocol):
    """What a connection tells the I/O layer and the role above it (each stream's own events go to
    its :class:`~drain_router.h2.streams.Handler`)."""

    def output_ready(self) -> None:
        """Output was gathered while there was none: take it (:meth:`Connection.data_to_send`) soon."""

    def stream_gone(self) -> None:
        """A stream left the connection."""

    def connection_failed(self) -> None:
        """A connection error: its GOAWAY is the last output; close once it is written."""

    def stream_requested(self, stream: Stream, headers: Headers, request: r.Request, end: bool) -> None:
        """A new stream's checked request head (server role): give it a handler, or refuse it."""

    def request_rejected(self) -> None:
        """A new stream's request head was malformed: it was reset and is never relayed."""

    def settings_applied(self, values: dict[int, int]) -> None:
        """The peer's SETTINGS (already acknowledged and applied)."""

    def ping_acked(self, opaque: bytes) -> None: ...
    def goaway_received(self, last_stream: int, code: int) -> None: ...


class Connection:
    """One end of one HTTP/2 connection (server role unless ``client_side``): the frames it receives,
    its streams, and what it sends on them."""

    def __init__(
        self, events: Events, *, client_side: bool, budgets: Budgets | None = None, max_backlog: int | None = None
    ) -> None:
        self.events = events
        self.client_side = client_side
        self.failed = False
        """A connection error was sent, or the transport is gone: nothing more goes out."""
        self.now = 0.0
        """The clock the budgets are paid by (passed in with each read)."""
        self.budgets = budgets or Budgets(0.0, limited=False)
        self.buffer = bytearray()
        """Bytes read and not yet a whole frame."""
        self.preface_seen = client_side
        """The client's preface (the server role waits for it)."""
        self.settings_seen = False
        """The peer's first frame must be SETTINGS (§3.4)."""
        self.blocks = HeaderBlocks()
        self.windows = Windows()
        self.peer_max_frame = frames.DEFAULT_MAX_FRAME
        """The peer's SETTINGS_MAX_FRAME_SIZE: no frame sent is larger."""
        self.encoder = hpackcache.Encoder()
        self.output = Output(events.output_ready, max_backlog)
        self.streams: dict[int, Stream] = {}
        self.closed = ClosedStreams(r.REMEMBERED_CLOSED_STREAMS)
        self.blocked: dict[int, Stream] = {}
        """Streams with data waiting for a window, in the order they blocked."""
        self.next_stream = 1
        """The next stream id this end opens (client role)."""
        self.last_peer_stream = 0
        """The highest stream id the peer opened (for GOAWAY)."""
        self.max_streams = r.MAX_CONCURRENT_STREAMS
        """Concurrent streams the peer may open (server role; advertised in SETTINGS)."""
        self.data_frames_sent = 0
        """DATA frames sent: each earns the peer frames without progress (:meth:`spend_idle`)."""

    def initiate(self) -> None:
        """This end's preface: SETTINGS and the connection window (the client role's magic first)."""
        ours = {
            frames.HEADER_TABLE_SIZE: r.HEADER_TABLE_BYTES,
            frames.ENABLE_PUSH: 0,
            frames.INITIAL_WINDOW_SIZE: r.STREAM_WINDOW,
            frames.MAX_HEADER_LIST_SIZE: r.MAX_HEADER_LIST_BYTES,
        }
        if not self.client_side:
            ours[frames.MAX_CONCURRENT_STREAMS] = self.max_streams
        increment = self.windows.open_recv()
        magic = frames.PREFACE if self.client_side else b""
        self.output.queue(magic + frames.settings(ours) + frames.window_update(0, increment))

    # -- bytes in ---------------------------------------------------------------------------------

    def receive(self, data: bytes, now: float) -> None:
        """Bytes from the peer; ``now`` is the clock the budgets are paid by."""
        if self.failed:
            return  # after a connection error: dropped until the I/O layer closes
        self.now = now
        buffer = self.buffer
        buffer += data
        try:
            if not self.preface_seen and not self._preface():
                return
            found, used = frames.split(buffer, frames.DEFAULT_MAX_FRAME)
            del buffer[:used]
            if len(found) > 1:
                found = frames.coalesce(found, frames.DEFAULT_MAX_FRAME)
            for frame in found:
                self.frame_received(*frame)
                if self.failed:
                    break
        except frames.FrameSizeError:
            self.fail(frames.FRAME_SIZE_ERROR, "frame larger than SETTINGS_MAX_FRAME_SIZE")
        except H2Error as exc:
            self.fail(exc.code, str(exc))
        if self.failed:
            buffer.clear()

    def _preface(self) -> bool:
        size = min(len(self.buffer), len(frames.PREFACE))
        if bytes(self.buffer[:size]) != frames.PREFACE[:size]:
            raise H2Error(frames.PROTOCOL_ERROR, "not an HTTP/2 connection preface (h2c prior knowledge only)")
        if size < len(frames.PREFACE):
            return False
        del self.buffer[:size]
        self.preface_seen = True
        return True

    def frame_received(self, kind: int, flags: int, sid: int, payload: bytes) -> None:
        if not self.settings_seen:
            if kind != frames.SETTINGS or flags & frames.ACK:
                raise H2Error(frames.PROTOCOL_ERROR, "the preface must be followed by SETTINGS")
            self.settings_seen = True
        if self.blocks.partial is not None and kind != frames.CONTINUATION:
            raise H2Error(frames.PROTOCOL_ERROR, "a header block interrupted")
        if kind == frames.DATA:
            self.data_frame(flags, sid, payload)
        elif kind == frames.HEADERS:
            block = self.blocks.headers_frame(flags, sid, payload)
            if block is not None:
                self.header_block(sid, *block)
        elif kind == frames.WINDOW_UPDATE:
            self.window_update_frame(sid, payload)
        elif kind == frames.CONTINUATION:
            block = self.blocks.continuation_frame(flags, sid, payload)
            if block is not None:
                self.header_block(sid, *block)
        elif kind == frames.RST_STREAM:
            self.rst_stream_frame(sid, payload)
        elif kind == frames.SETTINGS:
            self.settings_frame(flags, sid, payload)
        elif kind == frames.PING:
            self.ping_frame(flags, sid, payload)
        elif kind == frames.GOAWAY:
            if sid != 0:
                raise H2Error(frames.PROTOCOL_ERROR, "GOAWAY on a stream")
            if len(payload) < 8:
                raise H2Error(frames.FRAME_SIZE_ERROR, "GOAWAY length")
            self.goaway_frame(int.from_bytes(payload[:4], "big") & 0x7FFFFFFF, int.from_bytes(payload[4:8], "big"))
        elif kind == frames.PRIORITY:
            self.priority_frame(sid, payload)
        elif kind == frames.PUSH_PROMISE:
            raise H2Error(frames.PROTOCOL_ERROR, "PUSH_PROMISE (push is disabled)")
        else:
            self.spend_idle("frames of unknown types")  # ignored (§5.5)

    def data_frame(self, flags: int, sid: int, payload: bytes) -> None:
        length = len(payload)
        stream = self.streams.get(sid)
        if stream is not None:
            verdict = VERDICTS[id(stream.state)][frames.DATA]
        elif sid == 0:
            raise H2Error(frames.PROTOCOL_ERROR, "DATA on stream 0")
        else:
            verdict = self.stream_verdict(sid, frames.DATA)[1]
            if verdict is Verdict.PROTOCOL_ERROR:
                raise H2Error(frames.PROTOCOL_ERROR, "DATA on an idle stream")
        windows = self.windows
        if length > windows.recv:
            raise H2Error(frames.FLOW_CONTROL_ERROR, "DATA beyond the connection window")
        windows.recv -= length
        windows.unannounced += length
        if windows.unannounced >= ANNOUNCE_AT:
            self.control(frames.window_update(0, windows.announce()))
        if verdict is not ACCEPT or stream is None:
            self.judge(stream, sid, verdict, "DATA")  # in flight (ignored), or a stream error
            return
        if length > stream.recv_window:
            self.stream_error(stream, sid, frames.FLOW_CONTROL_ERROR)
            return
        stream.recv_window -= length
        data = frames.strip_padding(flags, payload) if flags & frames.PADDED else payload
        if data is None:
            raise H2Error(frames.PROTOCOL_ERROR, "invalid padding")
        end = bool(flags & frames.END_STREAM)
        if not data and not end:
            self.spend_idle("empty DATA frames")
        if len(data) != length:
            self.grant(stream, length - len(data))  # padding is never relayed: its window comes back now
        if stream.body_left >= 0 and not self.body_fits(stream, len(data), end):
            return
        if end:
            self.end_received(stream, stream.handler.on_data, data)
        else:
            stream.handler.on_data(stream, data, end)

    def body_fits(self, stream: Stream, n: int, end: bool) -> bool:
        """The DATA agrees with the message's ``content-length`` (§8.1.1); else the stream is malformed."""
        stream.body_left -= n
        if stream.body_left < 0 or (end and stream.body_left):
            self.stream_error(stream, stream.sid, frames.PROTOCOL_ERROR, Exit.MALFORMED)
            return False
        return True

    def rst_stream_frame(self, sid: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise H2Error(frames.FRAME_SIZE_ERROR, "RST_STREAM length")
        stream, verdict = self.stream_verdict(sid, frames.RST_STREAM)
        self.spend(self.budgets.resets, "stream resets")
        if self.judge(stream, sid, verdict, "RST_STREAM") and stream is not None:
            self.close_stream(stream, Closed.RESET_THERE, Exit.PEER_RESET, int.from_bytes(payload, "big"))

    def priority_frame(self, sid: int, payload: bytes) -> None:
        if sid == 0:
            raise H2Error(frames.PROTOCOL_ERROR, "PRIORITY on stream 0")
        stream = self.streams.get(sid)  # allowed in every state (§5.1), on any stream id
        self.spend_idle("PRIORITY frames")
        if len(payload) != 5:
            if stream is None:
                raise H2Error(frames.FRAME_SIZE_ERROR, "PRIORITY length")
            self.stream_error(stream, sid, frames.FRAME_SIZE_ERROR)
        elif int.from_bytes(payload[:4], "big") & 0x7FFFFFFF == sid:
            if stream is None:
                raise H2Error(frames.PROTOCOL_ERROR, "a stream depends on itself")
            self.stream_error(stream, sid, frames.PROTOCOL_ERROR)

    def window_update_frame(self, sid: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise H2Error(frames.FRAME_SIZE_ERROR, "WINDOW_UPDATE length")
        increment = int.from_bytes(payload, "big") & 0x7FFFFFFF
        if sid == 0:
            self.spend_idle("WINDOW_UPDATE frames")
            self.windows.send_opened(increment)
            self.unblock()
            return
        stream, verdict = self.stream_verdict(sid, frames.WINDOW_UPDATE)
        self.spend_idle("WINDOW_UPDATE frames")
        if not self.judge(stream, sid, verdict, "WINDOW_UPDATE") or stream is None:
            return
        if increment == 0:
            self.stream_error(stream, sid, frames.PROTOCOL_ERROR)
        elif stream.send_window + increment > frames.MAX_WINDOW:
            self.stream_error(stream, sid, frames.FLOW_CONTROL_ERROR)
        else:
            stream.send_window += increment
            if stream.pending or stream.pending_trailers is not None or stream.pending_end:
                self.drain(stream)

    def settings_frame(self, flags: int, sid: int, payload: bytes) -> None:
        if sid != 0:
            raise H2Error(frames.PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & frames.ACK:
            if payload:
                raise H2Error(frames.FRAME_SIZE_ERROR, "SETTINGS ack with a payload")
            self.spend_idle("SETTINGS acknowledgements")
            return
        self.spend(self.budgets.settings, "SETTINGS frames")
        values = frames.parse_settings(payload)
        if values is None:
            raise H2Error(frames.FRAME_SIZE_ERROR, "SETTINGS length")
        for key, value in values.items():
            if key == frames.INITIAL_WINDOW_SIZE:
                delta = self.windows.peer_initial_changed(value)
                for stream in self.streams.values():
                    stream.send_window += delta
                    if stream.send_window > frames.MAX_WINDOW:
                        raise H2Error(frames.FLOW_CONTROL_ERROR, "INITIAL_WINDOW_SIZE overflows a stream's window")
            elif key == frames.MAX_FRAME_SIZE:
                if not frames.DEFAULT_MAX_FRAME <= value <= frames.MAX_FRAME_CEILING:
                    raise H2Error(frames.PROTOCOL_ERROR, "MAX_FRAME_SIZE out of range")
                self.peer_max_frame = value
            elif key == frames.HEADER_TABLE_SIZE:
                self.encoder.resize(value)
            elif key == frames.ENABLE_PUSH and value > 1:
                raise H2Error(frames.PROTOCOL_ERROR, "ENABLE_PUSH not 0 or 1")
        self.control(frames.SETTINGS_ACK)
        self.events.settings_applied(values)
        self.unblock()

    def ping_frame(self, flags: int, sid: int, payload: bytes) -> None:
        if sid != 0:
            raise H2Error(frames.PROTOCOL_ERROR, "PING on a stream")
        if len(payload) != 8:
            raise H2Error(frames.FRAME_SIZE_ERROR, "PING length")
        if flags & frames.ACK:
            self.spend_idle("PING acknowledgements")
            self.events.ping_acked(payload)
        else:
            self.spend(self.budgets.pings, "PING frames")
            self.control(frames.ping(payload, ack=True))

    def goaway_frame(self, last_stream: int, code: int) -> None:
        """The peer opens no more streams, or (for streams this end opened) processed none above
        ``last_stream``: those leave as REFUSED, which a gRPC client retries transparently."""
        self.spend_idle("GOAWAY frames")
        if self.client_side:
            for stream in [s for sid, s in self.streams.items() if sid > last_stream]:
                self.close_stream(stream, Closed.RESET_THERE, Exit.REFUSED, frames.REFUSED_STREAM)
        self.events.goaway_received(last_stream, code)

    # -- header blocks ----------------------------------------------------------------------------

    def header_block(self, sid: int, headers: Headers, end: bool, self_dependent: bool) -> None:
        """A whole header block, decoded (:class:`~.blocks.HeaderBlocks`): what it does to its stream."""
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
        if end:
            self.end_received(stream, stream.handler.on_headers, headers)
        else:
            stream.handler.on_headers(stream, headers, end)

    def later_block(self, stream: Stream, headers: Headers, end: bool) -> bool:
        """Check a block on a stream that is open: a response's head (client role) or trailers; False
        for an informational response (dropped). Raises :class:`rules.Malformed`."""
        if self.client_side and not stream.heads:
            status, length = self.blocks.checked(headers, r.response)
            if status < 200:
                if end:
                    raise r.Malformed("an informational response ends its stream")
                return False
            stream.heads = 1
            stream.body_left = r.content_owed(status, length, stream.asked_head)
        else:
            if not end:
                raise r.Malformed("a second header block that does not end the stream")
            self.blocks.checked(headers, r.trailers)
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
        stream = Stream(sid, None, self.windows.peer_initial, r.STREAM_WINDOW)
        if end:
            stream.state = HALF_CLOSED_REMOTE
        self.streams[sid] = stream
        if self_dependent:
            self.stream_error(stream, sid, frames.PROTOCOL_ERROR)
            return
        try:
            request = self.blocks.checked(headers, r.request)
            if end and request.length > 0:
                raise r.Malformed("the stream ended short of its content-length")
        except r.Malformed:
            self.events.request_rejected()
            self.stream_error(stream, sid, frames.PROTOCOL_ERROR, Exit.MALFORMED)
            return
        stream.body_left = request.length
        self.events.stream_requested(stream, headers, request, end)

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

    # -- the peer's END_STREAM ---------------------------------------------------------------------

    def end_received(self, stream: Stream, deliver: Callable[[Stream, T, bool], None], last: T) -> None:
        """The peer ended ``stream`` with a frame carrying ``last`` (its last DATA, or a header block),
        handed to its handler by ``deliver``. The stream's state moves first, so the handler sees
        where it stands; a stream both ends have ended then leaves (it is never reset)."""
        stream.state = HALF_CLOSED_REMOTE if stream.state is OPEN else CLOSED
        deliver(stream, last, True)
        if stream.state is CLOSED:
            self.close_stream(stream, _ENDED, _EXIT_ENDED, frames.NO_ERROR)

    # -- the one way out --------------------------------------------------------------------------

    def close_stream(self, stream: Stream, how: Closed, exit: Exit, code: int) -> bool:
        """``stream`` leaves the connection, remembered as ``how``; its handler is told ``exit`` (the
        only place it is). False if it had left already."""
        if self.streams.pop(stream.sid, None) is None:
            return False
        if self.blocked:
            self.blocked.pop(stream.sid, None)
        stream.state = CLOSED
        if stream.pending:
            stream.pending.clear()
            stream.pending_trailers = None
        self.closed.add(stream.sid, how)
        handler = stream.handler
        if handler is not None:
            handler.on_closed(stream, exit, code)
        self.events.stream_gone()
        return True

    def reset(self, stream: Stream, code: int, exit: Exit = Exit.RESET) -> bool:
        """RST_STREAM ``code`` on ``stream``: it leaves the connection. False if it had left."""
        if stream.sid not in self.streams:
            return False
        if stream.state is CLOSED:  # both ends are done (its last frame is being handed on)
            return self.close_stream(stream, _ENDED, _EXIT_ENDED, frames.NO_ERROR)
        if not self.failed:
            self.control(frames.rst_stream(stream.sid, code))
        return self.close_stream(stream, Closed.RESET_HERE, exit, code)

    def end_sent(self, stream: Stream) -> None:
        """This end's END_STREAM went out: the stream is closed (its handler told so), or half-closed
        with the peer still sending (its handler told :meth:`Handler.on_end_sent`)."""
        if stream.state is OPEN:
            stream.state = HALF_CLOSED_LOCAL
            stream.handler.on_end_sent(stream)
        else:
            self.close_stream(stream, _ENDED, _EXIT_ENDED, frames.NO_ERROR)

    # -- streams out ------------------------------------------------------------------------------

    def open_stream(self, handler: Handler, headers: Headers, end: bool) -> Stream:
        """A new stream carrying ``headers`` (client role)."""
        sid = self.next_stream
        self.next_stream += 2
        stream = Stream(sid, handler, self.windows.peer_initial, r.STREAM_WINDOW)
        stream.asked_head = r.asks_head(headers)
        self.streams[sid] = stream
        self.send_headers(stream, headers, end)
        return stream

    def grant(self, stream: Stream, n: int) -> None:
        """The other side took ``n`` bytes of this stream's data: re-open its window (batched)."""
        if n <= 0 or (stream.state is not OPEN and stream.state is not HALF_CLOSED_LOCAL):
            return
        stream.ungranted += n
        if stream.ungranted >= r.STREAM_WINDOW // 4:
            self.control(frames.window_update(stream.sid, stream.ungranted))
            stream.recv_window += stream.ungranted
            stream.ungranted = 0

    def sending(self, stream: Stream) -> bool:
        """This end may still send on ``stream`` (send_headers and send_data test it inline)."""
        return not self.failed and (stream.state is OPEN or stream.state is HALF_CLOSED_REMOTE)

    def send_headers(self, stream: Stream, headers: Headers, end: bool) -> None:
        """A header block on ``stream``: now, or after the data waiting for a window (trailers). It is
        HPACK-encoded as it is written, so blocks reach the peer in the order they were encoded."""
        state = stream.state
        if self.failed or (state is not OPEN and state is not HALF_CLOSED_REMOTE):
            return
        if stream.pending:
            stream.pending_trailers = headers
            stream.pending_end = end
            return
        block = self.encoder.encode(headers)
        self.control(frames.headers(stream.sid, block, end_stream=end, max_frame=self.peer_max_frame))
        if end and not self.failed:
            self.end_sent(stream)

    def send_data(self, stream: Stream, data: bytes, end: bool) -> int:
        """Relay ``data`` on ``stream``; returns how many bytes went out now (the rest waits for the
        peer's window, and :meth:`Handler.on_sent` reports them)."""
        state = stream.state
        if self.failed or (state is not OPEN and state is not HALF_CLOSED_REMOTE):
            return len(data)
        n = len(data)
        windows = self.windows
        if not stream.pending and n <= stream.send_window and n <= windows.send and n <= self.peer_max_frame:
            stream.send_window -= n
            windows.send -= n
            self.data_frames_sent += 1
            self.output.queue(frames.data_header(n, stream.sid, end) + data)
            if end:
                self.end_sent(stream)
            return n
        if data:
            stream.pending.append(data)
        stream.pending_end = stream.pending_end or end
        return self.drain(stream, report=False)

    def drain(self, stream: Stream, *, report: bool = True) -> int:
        """Send what the windows allow of the stream's waiting data (then its trailers or end)."""
        sent = 0
        pending = stream.pending
        windows = self.windows
        while pending:
            room = min(stream.send_window, windows.send, self.peer_max_frame)
            if room <= 0:
                self.blocked[stream.sid] = stream
                break
            chunk = pending[0]
            if len(chunk) > room:
                pending[0] = chunk[room:]
                chunk = chunk[:room]
            else:
                pending.popleft()
            last = not pending and stream.pending_end and stream.pending_trailers is None
            stream.send_window -= len(chunk)
            windows.send -= len(chunk)
            self.data_frames_sent += 1
            self.output.queue(frames.data_header(len(chunk), stream.sid, last) + chunk)
            sent += len(chunk)
        if report and sent:
            stream.handler.on_sent(stream, sent)
        if not pending and self.sending(stream):
            self.blocked.pop(stream.sid, None)
            if stream.pending_trailers is not None:
                trailers, stream.pending_trailers = stream.pending_trailers, None
                self.send_headers(stream, trailers, stream.pending_end)
            elif stream.pending_end:
                if sent == 0:
                    self.output.queue(frames.data_header(0, stream.sid, True))
                self.end_sent(stream)
        return sent

    def unblock(self) -> None:
        windows = self.windows
        for stream in list(self.blocked.values()):
            if windows.send <= 0:
                break
            self.drain(stream)

    def discard_pending(self, stream: Stream) -> None:
        """Drop what waits on ``stream`` (a deadline: trailers must go out now)."""
        stream.pending.clear()
        stream.pending_trailers = None
        stream.pending_end = False
        self.blocked.pop(stream.sid, None)

    # -- output -----------------------------------------------------------------------------------

    def control(self, data: bytes) -> None:
        """Queue a frame that is not relayed DATA: past the output's bound while its transport is
        paused, the connection fails instead. Nothing follows a connection error's GOAWAY."""
        if self.failed:
            return
        if not self.output.control(data):
            self.fail(frames.ENHANCE_YOUR_CALM, "output not read")

    def data_to_send(self) -> bytes:
        """Everything gathered to write, in order (:meth:`.output.Output.data_to_send`)."""
        return self.output.data_to_send()

    def fail(self, code: int, reason: str) -> None:
        """A connection error (RFC 9113 §5.4.1): GOAWAY with ``code`` is the last frame, and every
        stream leaves (LOST)."""
        if self.failed:
            return
        self.failed = True
        self.output.clear()
        self.output.queue(frames.goaway(self.last_peer_stream, code, reason.encode()[:128]))
        self.close_all(code)
        self.events.connection_failed()

    def lost(self) -> None:
        """The transport closed: nothing more goes out, and every stream leaves (LOST)."""
        self.failed = True
        self.output.clear()
        self.close_all(frames.CANCEL)

    def close_all(self, code: int) -> None:
        """The connection is gone or failed: every stream leaves it."""
        for stream in list(self.streams.values()):
            self.close_stream(stream, Closed.RESET_HERE, Exit.LOST, code)
