"""What one end of an HTTP/2 connection sends, and the one way a stream leaves it. Sans-IO: frames
are gathered in :attr:`Sender.out` and the I/O layer takes them (:meth:`Sender.data_to_send`) when
told there is output (:meth:`Events.output_ready`).

Flow control gives back-pressure both ways: DATA goes out within the peer's windows, the
rest waits on its stream (at most one stream window, since the other side's window is re-opened only
for bytes taken here); a stream's receive window is re-opened in batches as the other side takes its
bytes (:meth:`Sender.grant`). Output other than relayed DATA (control frames, header blocks) queued
while the transport is paused has a bound: past it the connection fails with ENHANCE_YOUR_CALM.
"""

from __future__ import annotations

from typing import Protocol

from drain_router.h2 import frames, hpackcache
from drain_router.h2 import rules as r
from drain_router.h2.streams import (
    CLOSED,
    HALF_CLOSED_LOCAL,
    HALF_CLOSED_REMOTE,
    OPEN,
    Closed,
    ClosedStreams,
    Exit,
    Headers,
    Stream,
)

_ENDED, _EXIT_ENDED = Closed.ENDED, Exit.ENDED  # module globals: see streams.OPEN


class Events(Protocol):
    """What a connection tells the I/O layer and the role above it."""

    def output_ready(self) -> None:
        """Output was gathered while there was none: take it (:meth:`Sender.data_to_send`) soon."""

    def stream_gone(self) -> None:
        """A stream left the connection."""

    def connection_failed(self) -> None:
        """A connection error: its GOAWAY is the last output; close once it is written."""


class Sender:
    """One end's output, the streams on the connection, and their send windows."""

    def __init__(self, events: Events, *, client_side: bool, max_backlog: int | None) -> None:
        self.events = events
        self.client_side = client_side
        self.out: list[bytes] = []
        self.encoder = hpackcache.Encoder()
        self.streams: dict[int, Stream] = {}
        self.closed = ClosedStreams(r.REMEMBERED_CLOSED_STREAMS)
        self.send_window = frames.DEFAULT_WINDOW
        self.peer_initial_window = frames.DEFAULT_WINDOW
        self.peer_max_frame = frames.DEFAULT_MAX_FRAME
        self.blocked: dict[int, Stream] = {}
        """Streams with data waiting for a window, in the order they blocked."""
        self.failed = False
        self.paused = False
        """The transport's buffer is above its high-water mark (set by the I/O layer)."""
        self.max_backlog = max_backlog
        self.backlog = 0
        """Bytes other than relayed DATA queued since the transport paused."""
        self.data_frames_sent = 0
        self.last_peer_stream = 0
        """The highest stream id the peer opened (for GOAWAY)."""

    # -- output -----------------------------------------------------------------------------------

    def queue(self, data: bytes) -> None:
        if not self.out:
            self.events.output_ready()
        self.out.append(data)

    def control(self, data: bytes) -> None:
        """Queue a frame that is not relayed DATA: counted against the backlog bound while paused.
        Nothing follows a connection error's GOAWAY."""
        if self.failed:
            return
        if self.paused and self.max_backlog is not None:
            self.backlog += len(data)
            if self.backlog > self.max_backlog:
                self.fail(frames.ENHANCE_YOUR_CALM, "output not read")
                return
        if not self.out:
            self.events.output_ready()
        self.out.append(data)

    def data_to_send(self) -> bytes:
        data = b"".join(self.out)
        self.out.clear()
        return data

    def fail(self, code: int, reason: str) -> None:
        """A connection error (RFC 9113 §5.4.1): GOAWAY with ``code`` is the last frame, and every
        stream leaves (LOST)."""
        if self.failed:
            return
        self.failed = True
        self.out.clear()
        self.queue(frames.goaway(self.last_peer_stream, code, reason.encode()[:128]))
        self.close_all(code)
        self.events.connection_failed()

    def lost(self) -> None:
        """The transport closed: nothing more goes out, and every stream leaves (LOST)."""
        self.failed = True
        self.out.clear()
        self.close_all(frames.CANCEL)

    def close_all(self, code: int) -> None:
        """The connection is gone or failed: every stream leaves it."""
        for stream in list(self.streams.values()):
            self.close_stream(stream, Closed.RESET_HERE, Exit.LOST, code)

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
        if not stream.pending and n <= stream.send_window and n <= self.send_window and n <= self.peer_max_frame:
            stream.send_window -= n
            self.send_window -= n
            self.data_frames_sent += 1
            self.queue(frames.data_header(n, stream.sid, end) + data)
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
        while pending:
            room = min(stream.send_window, self.send_window, self.peer_max_frame)
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
            self.send_window -= len(chunk)
            self.data_frames_sent += 1
            self.queue(frames.data_header(len(chunk), stream.sid, last) + chunk)
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
                    self.queue(frames.data_header(0, stream.sid, True))
                self.end_sent(stream)
        return sent

    def unblock(self) -> None:
        for stream in list(self.blocked.values()):
            if self.send_window <= 0:
                break
            self.drain(stream)

    def discard_pending(self, stream: Stream) -> None:
        """Drop what waits on ``stream`` (a deadline: trailers must go out now)."""
        stream.pending.clear()
        stream.pending_trailers = None
        stream.pending_end = False
        self.blocked.pop(stream.sid, None)
