"""What both ends of a relayed HTTP/2 stream share: one connection's frames, HPACK and flow control.

A :class:`Connection` is an asyncio Protocol speaking HTTP/2 on one socket: the client's
(:mod:`~drain_router.proxy.grpc.inbound`, server role) or the model server's
(:mod:`~drain_router.proxy.grpc.outbound`, client role). Each stream on it is a :class:`Leg`, and each
leg belongs to a :class:`Relay` (a relayed call) that pairs it with the leg on the other connection.

Flow control gives back-pressure both ways (SPEC 4): a stream's receive window is re-opened only for
bytes the other side took (sent within its window into a transport that is not paused:
:meth:`Connection.grant`); the connection window is re-opened as bytes arrive, since the stream
windows already bound what waits. Output is gathered per connection and written once per read
(:func:`flush_all`).
"""

from __future__ import annotations

import asyncio
import collections
from typing import Any, Protocol, cast

import hpack

from drain_router.proxy.client import BODY_LINGER_SECS
from drain_router.proxy.grpc import frames
from drain_router.proxy.grpc import rules as r

Headers = list[tuple[bytes, bytes]]

#: Header blocks and header lists a connection remembers, each way (see :meth:`Connection.decode`),
#: and the largest block remembered: at most 64 KiB per connection and direction.
HPACK_CACHE_ENTRIES = 64
HPACK_CACHE_BLOCK_BYTES = 1024

#: Stream ids a connection remembers having reset, so that frames crossing the reset are ignored.
REMEMBERED_RESETS = 256

_DIRTY: list[Connection] = []
"""Connections with output gathered during this turn of the loop (one thread: a module list)."""


def table_mark(table: Any) -> tuple[int, object]:
    """What changes whenever an HPACK dynamic table does: an entry is always added in front (a new
    object), and an eviction without an addition shortens it."""
    entries = table.dynamic_entries
    return len(entries), (entries[0] if entries else None)


def remember(
    cache: dict[Any, Any], key: Any, value: Any, block: bytes, before: tuple[int, object], after: tuple[int, object]
) -> None:
    """Remember ``value`` when the block left the HPACK table as it was (``before`` and ``after`` its
    :func:`table_mark`); a block that changed the table moves its indexes, so everything remembered
    is forgotten then."""
    if before[0] != after[0] or before[1] is not after[1]:
        cache.clear()
    elif len(cache) < HPACK_CACHE_ENTRIES and len(block) <= HPACK_CACHE_BLOCK_BYTES:
        cache[key] = value


def flush_all() -> None:
    """Write what every connection gathered: called at the end of each read and of each timer."""
    while _DIRTY:
        _DIRTY.pop().flush()


class Relay(Protocol):
    """What a connection tells the call a leg belongs to."""

    def on_headers(self, leg: Leg, headers: Headers, end: bool) -> None: ...
    def on_data(self, leg: Leg, data: bytes, end: bool) -> None: ...
    def on_reset(self, leg: Leg, code: int) -> None: ...
    def on_lost(self, leg: Leg) -> None: ...
    def on_invalid(self, leg: Leg) -> None:
        """The peer broke the protocol on this stream (its flow control): the router reset it."""

    def on_sent(self, leg: Leg, n: int) -> None:
        """``n`` bytes that waited for the peer's window went out."""

    def on_end_sent(self, leg: Leg) -> None:
        """This side's END_STREAM (or trailers) went out."""

    def on_writable(self, leg: Leg) -> None:
        """The leg's connection's transport took its buffered output (resume_writing)."""


class Leg:
    """One stream on one connection."""

    __slots__ = (
        "conn",
        "local_closed",
        "owed",
        "pending",
        "pending_end",
        "pending_trailers",
        "recv_window",
        "relay",
        "remote_closed",
        "send_window",
        "sid",
        "ungranted",
    )

    def __init__(self, conn: Connection, sid: int, relay: Relay) -> None:
        self.conn = conn
        self.sid = sid
        self.relay = relay
        self.send_window = conn.peer_initial_window
        self.recv_window = r.STREAM_WINDOW
        self.ungranted = 0
        """Bytes taken by the other side, not yet announced in a WINDOW_UPDATE (batched)."""
        self.owed = 0
        """Bytes relayed into a paused transport: granted once it resumes."""
        self.pending: collections.deque[bytes] = collections.deque()
        self.pending_end = False
        self.pending_trailers: Headers | None = None
        self.local_closed = False
        self.remote_closed = False


class H2Error(Exception):
    """A connection error (RFC 9113 §5.4.1): GOAWAY with ``code``, then close."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code = code


class Connection(asyncio.Protocol):
    """One HTTP/2 connection: frames in, output gathered, flow control, HPACK."""

    CLIENT_SIDE = False

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.legs: dict[int, Leg] = {}
        self.out: list[bytes] = []
        self.encoder = hpack.Encoder()
        self.decoder = hpack.Decoder(max_header_list_size=r.MAX_HEADER_LIST_BYTES)
        self.decoder.max_allowed_table_size = r.HEADER_TABLE_BYTES
        self.decoded: dict[bytes, Headers] = {}
        self.encoded: dict[tuple[tuple[bytes, bytes], ...], bytes] = {}
        self.send_window = frames.DEFAULT_WINDOW
        self.recv_window = frames.DEFAULT_WINDOW
        self.recv_unannounced = 0
        self.peer_initial_window = frames.DEFAULT_WINDOW
        self.peer_max_frame = frames.DEFAULT_MAX_FRAME
        self.peer_max_streams: int | None = None
        self.blocked: dict[int, Leg] = {}
        """Legs with data waiting for a window, in the order they blocked."""
        self.block: tuple[int, int, bytearray] | None = None
        """A header block being assembled from HEADERS and CONTINUATION: (stream, flags, bytes)."""
        self.write_paused = False
        self.closed = False
        self.last_peer_stream = 0
        """The highest stream id the peer opened (for GOAWAY)."""
        self.reset_streams: dict[int, None] = {}
        """The streams this end reset most recently (frames the peer sent before it saw the reset
        are ignored, §5.1); the oldest are forgotten past :data:`REMEMBERED_RESETS`."""

    # -- the router's own frames ----------------------------------------------------------------

    def local_settings(self) -> bytes:
        """SETTINGS and the connection window this end opens with."""
        ours = {
            frames.HEADER_TABLE_SIZE: r.HEADER_TABLE_BYTES,
            frames.ENABLE_PUSH: 0,
            frames.INITIAL_WINDOW_SIZE: r.STREAM_WINDOW,
            frames.MAX_HEADER_LIST_SIZE: r.MAX_HEADER_LIST_BYTES,
        }
        ours.update(self.extra_settings())
        self.recv_window = r.CONNECTION_WINDOW
        return frames.settings(ours) + frames.window_update(0, r.CONNECTION_WINDOW - frames.DEFAULT_WINDOW)

    def extra_settings(self) -> dict[int, int]:
        return {}

    def queue(self, data: bytes) -> None:
        if not self.out:
            _DIRTY.append(self)
        self.out.append(data)

    def flush(self) -> None:
        if self.out:
            if self.transport is not None and not self.closed:
                self.transport.write(b"".join(self.out))
            self.out.clear()

    # -- asyncio.Protocol -------------------------------------------------------------------------

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        for leg in list(self.legs.values()):
            leg.relay.on_writable(leg)
        flush_all()

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return  # after a connection error: read and dropped until the lingering close ends
        buffer = self.buffer
        buffer += data
        try:
            if not self.before_frames():
                return
            found, used = frames.split(buffer, frames.DEFAULT_MAX_FRAME)
            del buffer[:used]
            if len(found) > 1:
                found = frames.coalesce(found, frames.DEFAULT_MAX_FRAME)
            for frame in found:
                self.frame_received(*frame)
                if self.closed:
                    break
        except frames.FrameSizeError:
            self.fail(frames.FRAME_SIZE_ERROR, "frame larger than SETTINGS_MAX_FRAME_SIZE")
        except H2Error as exc:
            self.fail(exc.code, str(exc))
        flush_all()

    def before_frames(self) -> bool:
        """Whatever must precede the frames (the client's preface); False to wait for more bytes."""
        return True

    def fail(self, code: int, reason: str) -> None:
        """A connection error: GOAWAY with ``code``, its streams end now, and a lingering close
        (half-close, then read and drop for a while), so the peer reads the GOAWAY instead of a
        reset caused by what it is still sending."""
        if self.closed:
            return
        self.out.clear()
        self.queue(frames.goaway(self.last_peer_stream, code, reason.encode()[:128]))
        self.flush()
        self.closed = True
        self.buffer.clear()
        transport = self.transport
        if transport is not None:
            if transport.can_write_eof():
                transport.write_eof()
                asyncio.get_running_loop().call_later(BODY_LINGER_SECS, transport.close)
            else:
                transport.close()
        self.drop_legs()

    def close(self) -> None:
        """Close after what is gathered is written (a graceful end: every stream is done)."""
        if self.closed:
            return
        self.flush()
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.transport = None
        self.out.clear()
        self.drop_legs()
        flush_all()

    def drop_legs(self) -> None:
        """The connection is gone: every stream on it ends for its call."""
        legs = list(self.legs.values())
        self.legs.clear()
        self.blocked.clear()
        for leg in legs:
            leg.relay.on_lost(leg)

    # -- frames in --------------------------------------------------------------------------------

    def frame_received(self, kind: int, flags: int, sid: int, payload: bytes) -> None:
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
            if sid == 0 or len(payload) != 4:
                raise H2Error(frames.PROTOCOL_ERROR, "invalid RST_STREAM")
            self.reset_received(sid, int.from_bytes(payload, "big"))
        elif kind == frames.SETTINGS:
            self.settings_frame(flags, sid, payload)
        elif kind == frames.PING:
            if sid != 0 or len(payload) != 8:
                raise H2Error(frames.PROTOCOL_ERROR, "invalid PING")
            if flags & frames.ACK:
                self.ping_acked(payload)
            else:
                self.ping_received()
                self.queue(frames.ping(payload, ack=True))
        elif kind == frames.GOAWAY:
            if sid != 0 or len(payload) < 8:
                raise H2Error(frames.PROTOCOL_ERROR, "invalid GOAWAY")
            self.goaway_received(int.from_bytes(payload[:4], "big") & 0x7FFFFFFF, int.from_bytes(payload[4:8], "big"))
        elif kind == frames.PRIORITY:
            if sid == 0 or len(payload) != 5:
                raise H2Error(frames.PROTOCOL_ERROR, "invalid PRIORITY")
        elif kind == frames.PUSH_PROMISE:
            raise H2Error(frames.PROTOCOL_ERROR, "PUSH_PROMISE (push is disabled)")
        # Unknown frame types are ignored (§5.5).

    def data_frame(self, flags: int, sid: int, payload: bytes) -> None:
        length = len(payload)
        if sid == 0:
            raise H2Error(frames.PROTOCOL_ERROR, "DATA on stream 0")
        if length > self.recv_window:
            raise H2Error(frames.FLOW_CONTROL_ERROR, "DATA beyond the connection window")
        self.recv_window -= length
        self.recv_unannounced += length
        if self.recv_unannounced >= r.CONNECTION_WINDOW // 4:
            self.queue(frames.window_update(0, self.recv_unannounced))
            self.recv_window += self.recv_unannounced
            self.recv_unannounced = 0
        leg = self.legs.get(sid)
        if leg is None or leg.remote_closed:
            if sid > self.last_peer_stream and not self.own_stream(sid):
                raise H2Error(frames.PROTOCOL_ERROR, "DATA on an idle stream")
            return  # a stream already reset or closed: frames in flight are ignored (§5.1)
        if length > leg.recv_window:
            self.reset(leg, frames.FLOW_CONTROL_ERROR)
            leg.relay.on_invalid(leg)
            return
        leg.recv_window -= length
        data = frames.strip_padding(flags, payload)
        if data is None:
            raise H2Error(frames.PROTOCOL_ERROR, "invalid padding")
        if len(data) != length:
            self.grant(leg, length - len(data))  # padding is never relayed: its window comes back now
        end = bool(flags & frames.END_STREAM)
        if end:
            self.remote_ended(leg)
        leg.relay.on_data(leg, data, end)

    def own_stream(self, sid: int) -> bool:
        """Whether ``sid`` is a stream id this end opens (odd for a client, even for a server)."""
        return (sid % 2 == 1) == self.CLIENT_SIDE

    def headers_frame(self, flags: int, sid: int, payload: bytes) -> None:
        if sid == 0:
            raise H2Error(frames.PROTOCOL_ERROR, "HEADERS on stream 0")
        body = frames.strip_padding(flags, payload)
        if body is None:
            raise H2Error(frames.PROTOCOL_ERROR, "invalid padding")
        if flags & frames.PRIORITY_FLAG:
            body = body[5:]
        if flags & frames.END_HEADERS:
            self.header_block(sid, flags, body)
        else:
            self.block = (sid, flags, bytearray(body))
            self.check_block_size(len(body))

    def continuation_frame(self, flags: int, sid: int, payload: bytes) -> None:
        block = self.block
        if block is None or block[0] != sid:
            raise H2Error(frames.PROTOCOL_ERROR, "CONTINUATION without its HEADERS")
        block[2].extend(payload)
        self.check_block_size(len(block[2]))
        if flags & frames.END_HEADERS:
            self.block = None
            self.header_block(sid, block[1], bytes(block[2]))

    def check_block_size(self, size: int) -> None:
        if size > r.MAX_HEADER_BLOCK_BYTES:
            raise H2Error(frames.ENHANCE_YOUR_CALM, "header block too large")

    def header_block(self, sid: int, flags: int, block: bytes) -> None:
        headers = self.decode(block)
        end = bool(flags & frames.END_STREAM)
        leg = self.legs.get(sid)
        if leg is None:
            self.new_stream(sid, headers, end)
            return
        if leg.remote_closed:
            self.reset(leg, frames.STREAM_CLOSED)
            return
        if end:
            self.remote_ended(leg)
        leg.relay.on_headers(leg, headers, end)

    def decode(self, block: bytes) -> Headers:
        """A header block's list. HPACK in Python costs 10-50 µs a block, and a gRPC call's blocks
        repeat (the same method, the same response head, ``grpc-status: 0``): a block that left the
        dynamic table as it was (indexed fields, literals not indexed) decodes the same way until a
        block changes the table, so its list is remembered until then. The list is shared: nobody
        changes a header list after decoding."""
        headers = self.decoded.get(block)
        if headers is not None:
            return headers
        before = table_mark(self.decoder.header_table)
        try:
            # raw=True: (bytes, bytes) pairs, as HeaderTuple (a tuple subclass).
            headers = cast(Headers, list(self.decoder.decode(block, raw=True)))
        except hpack.OversizedHeaderListError:
            raise H2Error(frames.ENHANCE_YOUR_CALM, "header list too large") from None
        except hpack.HPACKError:
            raise H2Error(frames.COMPRESSION_ERROR, "invalid header block") from None
        remember(self.decoded, block, headers, block, before, table_mark(self.decoder.header_table))
        return headers

    def encode(self, headers: Headers) -> bytes:
        """A header list's block, remembered the same way (see :meth:`decode`). Not Huffman-coded:
        the router's peers are on the same node or network, where the CPU costs more than bytes."""
        key = tuple(headers)
        block = self.encoded.get(key)
        if block is None:
            before = table_mark(self.encoder.header_table)
            block = self.encoder.encode(headers, huffman=False)
            remember(self.encoded, key, block, block, before, table_mark(self.encoder.header_table))
        return block

    def new_stream(self, sid: int, headers: Headers, end: bool) -> None:
        """HEADERS on a stream this connection does not know (a request, for the server role)."""
        raise H2Error(frames.PROTOCOL_ERROR, "HEADERS on an unknown stream")

    def settings_frame(self, flags: int, sid: int, payload: bytes) -> None:
        if sid != 0:
            raise H2Error(frames.PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & frames.ACK:
            if payload:
                raise H2Error(frames.FRAME_SIZE_ERROR, "SETTINGS ack with a payload")
            return
        self.settings_received()
        values = frames.parse_settings(payload)
        if values is None:
            raise H2Error(frames.FRAME_SIZE_ERROR, "SETTINGS length")
        for key, value in values.items():
            if key == frames.INITIAL_WINDOW_SIZE:
                if value > frames.MAX_WINDOW:
                    raise H2Error(frames.FLOW_CONTROL_ERROR, "INITIAL_WINDOW_SIZE too large")
                delta = value - self.peer_initial_window
                self.peer_initial_window = value
                for leg in self.legs.values():
                    leg.send_window += delta
            elif key == frames.MAX_FRAME_SIZE:
                if not frames.DEFAULT_MAX_FRAME <= value <= frames.MAX_FRAME_CEILING:
                    raise H2Error(frames.PROTOCOL_ERROR, "MAX_FRAME_SIZE out of range")
                self.peer_max_frame = value
            elif key == frames.HEADER_TABLE_SIZE:
                self.encoder.header_table_size = min(value, r.HEADER_TABLE_BYTES)
                self.encoded.clear()  # the next block carries the size update
            elif key == frames.MAX_CONCURRENT_STREAMS:
                self.peer_max_streams = value
                self.streams_limited(value)
            elif key == frames.ENABLE_PUSH and value > 1:
                raise H2Error(frames.PROTOCOL_ERROR, "ENABLE_PUSH not 0 or 1")
        self.queue(frames.SETTINGS_ACK)
        self.unblock()

    def window_update_frame(self, sid: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise H2Error(frames.FRAME_SIZE_ERROR, "WINDOW_UPDATE length")
        increment = int.from_bytes(payload, "big") & 0x7FFFFFFF
        if sid == 0:
            if increment == 0:
                raise H2Error(frames.PROTOCOL_ERROR, "WINDOW_UPDATE of 0")
            self.send_window += increment
            if self.send_window > frames.MAX_WINDOW:
                raise H2Error(frames.FLOW_CONTROL_ERROR, "connection window overflow")
            self.unblock()
            return
        leg = self.legs.get(sid)
        if leg is None:
            return
        if increment == 0 or leg.send_window + increment > frames.MAX_WINDOW:
            self.reset(leg, frames.PROTOCOL_ERROR if increment == 0 else frames.FLOW_CONTROL_ERROR)
            leg.relay.on_invalid(leg)
            return
        leg.send_window += increment
        if leg.pending or leg.pending_trailers is not None or leg.pending_end:
            self.drain(leg)

    # Hooks for the two roles.
    def reset_received(self, sid: int, code: int) -> None:
        leg = self.legs.get(sid)
        if leg is not None:
            self.forget(leg)
            leg.relay.on_reset(leg, code)
            self.leg_gone(leg)

    def settings_received(self) -> None: ...
    def ping_received(self) -> None: ...
    def ping_acked(self, opaque: bytes) -> None: ...
    def goaway_received(self, last_stream: int, code: int) -> None: ...
    def streams_limited(self, limit: int) -> None: ...
    def leg_gone(self, leg: Leg) -> None:
        """A leg left :attr:`legs` (both halves closed, or reset)."""

    # -- streams out ------------------------------------------------------------------------------

    def grant(self, leg: Leg, n: int) -> None:
        """The other side took ``n`` bytes of this leg's data: re-open its window (batched)."""
        if leg.remote_closed or n <= 0:
            return
        leg.ungranted += n
        if leg.ungranted >= r.STREAM_WINDOW // 8:
            self.queue(frames.window_update(leg.sid, leg.ungranted))
            leg.recv_window += leg.ungranted
            leg.ungranted = 0

    def send_headers(self, leg: Leg, headers: Headers, end: bool) -> None:
        """A header block on ``leg``: now, or after the data waiting for a window (trailers). It is
        HPACK-encoded as it is written, so blocks reach the peer in the order they were encoded."""
        if leg.local_closed or self.closed:
            return
        if leg.pending:
            leg.pending_trailers = headers
            leg.pending_end = end
            return
        self.queue(frames.headers(leg.sid, self.encode(headers), end_stream=end, max_frame=self.peer_max_frame))
        if end:
            self.local_ended(leg)

    def send_data(self, leg: Leg, data: bytes, end: bool) -> int:
        """Relay ``data`` on ``leg``; returns how many bytes went out now (the rest waits for the
        peer's window, and :meth:`Relay.on_sent` reports them)."""
        if leg.local_closed or self.closed:
            return len(data)
        n = len(data)
        if not leg.pending and n <= leg.send_window and n <= self.send_window and n <= self.peer_max_frame:
            leg.send_window -= n
            self.send_window -= n
            self.queue(frames.data_header(n, leg.sid, end) + data)
            if end:
                self.local_ended(leg)
            return n
        if data:
            leg.pending.append(data)
        leg.pending_end = leg.pending_end or end
        return self.drain(leg, report=False)

    def drain(self, leg: Leg, *, report: bool = True) -> int:
        """Send what the windows allow of the leg's waiting data (then its trailers or end)."""
        sent = 0
        pending = leg.pending
        while pending:
            room = min(leg.send_window, self.send_window, self.peer_max_frame)
            if room <= 0:
                self.blocked[leg.sid] = leg
                break
            chunk = pending[0]
            if len(chunk) > room:
                pending[0] = chunk[room:]
                chunk = chunk[:room]
            else:
                pending.popleft()
            last = not pending and leg.pending_end and leg.pending_trailers is None
            leg.send_window -= len(chunk)
            self.send_window -= len(chunk)
            self.queue(frames.data_header(len(chunk), leg.sid, last) + chunk)
            sent += len(chunk)
        if not pending:
            self.blocked.pop(leg.sid, None)
            if leg.pending_trailers is not None:
                trailers, leg.pending_trailers = leg.pending_trailers, None
                self.send_headers(leg, trailers, leg.pending_end)
            elif leg.pending_end and not leg.local_closed:
                if sent == 0:
                    self.queue(frames.data_header(0, leg.sid, True))
                self.local_ended(leg)
        if report and sent:
            leg.relay.on_sent(leg, sent)
        return sent

    def unblock(self) -> None:
        for leg in list(self.blocked.values()):
            if self.send_window <= 0:
                break
            self.drain(leg)

    def reset(self, leg: Leg, code: int) -> None:
        """RST_STREAM ``code`` on ``leg``: it ends both ways and leaves the connection."""
        if not self.forget(leg):
            return
        leg.pending.clear()
        leg.pending_trailers = None
        if not self.closed:
            self.queue(frames.rst_stream(leg.sid, code))
        self.note_reset(leg.sid)
        self.leg_gone(leg)

    def forget(self, leg: Leg) -> bool:
        """``leg`` ends both ways and leaves the connection (no frame is sent); False if it had left."""
        if self.legs.pop(leg.sid, None) is None:
            return False
        self.blocked.pop(leg.sid, None)
        leg.local_closed = leg.remote_closed = True
        return True

    def note_reset(self, sid: int) -> None:
        resets = self.reset_streams
        resets[sid] = None
        if len(resets) > REMEMBERED_RESETS:
            del resets[next(iter(resets))]

    def local_ended(self, leg: Leg) -> None:
        leg.local_closed = True
        if leg.remote_closed:
            self.legs.pop(leg.sid, None)
            self.leg_gone(leg)
        leg.relay.on_end_sent(leg)

    def remote_ended(self, leg: Leg) -> None:
        leg.remote_closed = True
        if leg.local_closed:
            self.legs.pop(leg.sid, None)
            self.leg_gone(leg)

    def discard_pending(self, leg: Leg) -> None:
        """Drop what waits on ``leg`` (the deadline: trailers must go out now)."""
        leg.pending.clear()
        leg.pending_trailers = None
        leg.pending_end = False
        self.blocked.pop(leg.sid, None)
