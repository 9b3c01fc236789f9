"""One end of an HTTP/2 connection, sans-IO: bytes in (:meth:`Connection.receive`), events out to
each stream's :class:`~drain_router.h2.streams.Handler` and to the role above
(:class:`Events`), bytes out gathered for the I/O layer to take (:class:`~.sending.Sender`).

Every received frame is judged once: frames that belong to the connection here, frames on a stream
by RFC 9113 §5.1's table (:data:`~drain_router.h2.streams.RECEIVED`), then header blocks by
§8's rules, the same way whichever block of the stream they are (:mod:`.blocks`). Frames that cost
work without progress are paid from budgets (a client connection's; the model server's has none).
"""

from __future__ import annotations

from typing import Protocol

from drain_router.h2 import blocks, frames
from drain_router.h2 import rules as r
from drain_router.h2.blocks import Blocks
from drain_router.h2.frames import H2Error
from drain_router.h2.rules import Budgets
from drain_router.h2.streams import (
    ACCEPT,
    CLOSED,
    HALF_CLOSED_REMOTE,
    OPEN,
    VERDICTS,
    Closed,
    Exit,
    Stream,
    Verdict,
)

_ENDED, _EXIT_ENDED = Closed.ENDED, Exit.ENDED  # module globals: see streams.OPEN


class Events(blocks.Events, Protocol):
    def settings_applied(self, values: dict[int, int]) -> None:
        """The peer's SETTINGS (already acknowledged and applied)."""

    def ping_acked(self, opaque: bytes) -> None: ...
    def goaway_received(self, last_stream: int, code: int) -> None: ...


class Connection(Blocks):
    """One end of one HTTP/2 connection (server role unless ``client_side``)."""

    def __init__(
        self, events: Events, *, client_side: bool, budgets: Budgets | None = None, max_backlog: int | None = None
    ) -> None:
        super().__init__(events, client_side=client_side, budgets=budgets, max_backlog=max_backlog)
        self.role_events = events
        self.now = 0.0
        self.buffer = bytearray()
        self.preface_seen = client_side
        """The client's preface (the server role waits for it)."""
        self.settings_seen = False
        """The peer's first frame must be SETTINGS (§3.4)."""
        self.recv_window = frames.DEFAULT_WINDOW
        self.recv_unannounced = 0

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
        self.recv_window = r.CONNECTION_WINDOW
        magic = frames.PREFACE if self.client_side else b""
        self.queue(magic + frames.settings(ours) + frames.window_update(0, r.CONNECTION_WINDOW - frames.DEFAULT_WINDOW))

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
        if self.block is not None and kind != frames.CONTINUATION:
            raise H2Error(frames.PROTOCOL_ERROR, "a header block interrupted")
        if kind == frames.DATA:
            self.data_frame(flags, sid, payload)
        elif kind == frames.HEADERS:
            self.headers_frame(flags, sid, payload)
        elif kind == frames.WINDOW_UPDATE:
            self.window_update_frame(sid, payload)
        elif kind == frames.CONTINUATION:
            self.continuation_frame(flags, sid, payload)
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
        if length > self.recv_window:
            raise H2Error(frames.FLOW_CONTROL_ERROR, "DATA beyond the connection window")
        self.recv_window -= length
        self.recv_unannounced += length
        if self.recv_unannounced >= r.CONNECTION_WINDOW // 4:
            self.control(frames.window_update(0, self.recv_unannounced))
            self.recv_window += self.recv_unannounced
            self.recv_unannounced = 0
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
            stream.state = HALF_CLOSED_REMOTE if stream.state is OPEN else CLOSED
            stream.handler.on_data(stream, data, end)
            if stream.state is CLOSED:
                self.close_stream(stream, _ENDED, _EXIT_ENDED, frames.NO_ERROR)
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
        # Otherwise ignored: the router relays streams as they come (RFC 9113 deprecates priorities).

    def window_update_frame(self, sid: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise H2Error(frames.FRAME_SIZE_ERROR, "WINDOW_UPDATE length")
        increment = int.from_bytes(payload, "big") & 0x7FFFFFFF
        if sid == 0:
            self.spend_idle("WINDOW_UPDATE frames")
            if increment == 0:
                raise H2Error(frames.PROTOCOL_ERROR, "WINDOW_UPDATE of 0")
            self.send_window += increment
            if self.send_window > frames.MAX_WINDOW:
                raise H2Error(frames.FLOW_CONTROL_ERROR, "connection window overflow")
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
                if value > frames.MAX_WINDOW:
                    raise H2Error(frames.FLOW_CONTROL_ERROR, "INITIAL_WINDOW_SIZE too large")
                delta = value - self.peer_initial_window
                self.peer_initial_window = value
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
        self.role_events.settings_applied(values)
        self.unblock()

    def ping_frame(self, flags: int, sid: int, payload: bytes) -> None:
        if sid != 0:
            raise H2Error(frames.PROTOCOL_ERROR, "PING on a stream")
        if len(payload) != 8:
            raise H2Error(frames.FRAME_SIZE_ERROR, "PING length")
        if flags & frames.ACK:
            self.spend_idle("PING acknowledgements")
            self.role_events.ping_acked(payload)
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
        self.role_events.goaway_received(last_stream, code)
