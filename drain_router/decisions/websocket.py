"""WebSocket (RFC 6455) decisions for the tunnel, as data. Pure, no I/O.

:func:`handshake` decides once whether an ``Upgrade`` request is a WebSocket handshake the router
forwards, or a clear error (400, or 501 for other ``Upgrade`` tokens). :func:`accept_matches` checks
the upstream's ``Sec-WebSocket-Accept`` (§4.2.2). :class:`FrameTracker` follows frame headers in one
direction to know where each frame ends, so a Close can be sent at a frame boundary; it never parses
or buffers payloads (at most the 14 bytes of one header), and never allocates by a length.
"""

from __future__ import annotations

import base64
import hashlib
import struct

Headers = list[tuple[bytes, bytes]]

#: RFC 6455 §1.3.
GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
GOING_AWAY = 1001
PROTOCOL_ERROR = 1002
BAD_GATEWAY = 1014
"""Sent to the client when the model server's connection is lost without a Close (IANA's
WebSocket close code registry: a gateway's upstream failed)."""

#: :func:`handshake`'s verdicts besides ``None`` (a WebSocket handshake to forward).
NOT_WEBSOCKET = "upgrade_not_supported"  # another Upgrade token: 501
BAD_HANDSHAKE = "bad_websocket_handshake"  # a WebSocket Upgrade that is not a valid handshake: 400


def _tokens(headers: Headers, name: bytes) -> set[bytes]:
    return {t.strip().lower() for n, v in headers if n.lower() == name for t in v.split(b",") if t.strip()}


def handshake(method: bytes, version: tuple[int, int], headers: Headers) -> str | None:
    """``None`` for a WebSocket opening handshake (RFC 6455 §4.1: GET, HTTP/1.1 or later,
    ``Connection: upgrade``, ``Upgrade: websocket``, one 16-byte base64 ``Sec-WebSocket-Key``,
    ``Sec-WebSocket-Version: 13``); :data:`NOT_WEBSOCKET` when ``Upgrade`` names no ``websocket``
    token; :data:`BAD_HANDSHAKE` otherwise. Called only when the parser reported an upgrade."""
    if _tokens(headers, b"upgrade") != {b"websocket"}:
        return NOT_WEBSOCKET
    if method != b"GET" or version < (1, 1) or b"upgrade" not in _tokens(headers, b"connection"):
        return BAD_HANDSHAKE
    keys = [v for n, v in headers if n.lower() == b"sec-websocket-key"]
    versions = [v.strip() for n, v in headers if n.lower() == b"sec-websocket-version"]
    if len(keys) != 1 or versions != [b"13"]:
        return BAD_HANDSHAKE
    try:
        if len(base64.b64decode(keys[0].strip(), validate=True)) != 16:
            return BAD_HANDSHAKE
    except ValueError:
        return BAD_HANDSHAKE
    return None


def accept_for(key: bytes) -> bytes:
    """The ``Sec-WebSocket-Accept`` value for a client's key (§4.2.2 item 5.4)."""
    return base64.b64encode(hashlib.sha1(key.strip() + GUID).digest())  # RFC 6455 names SHA-1


def accept_matches(key: bytes, response_headers: Headers) -> bool:
    """Whether a 101 carries exactly one ``Sec-WebSocket-Accept`` that answers ``key`` and upgrades to
    ``websocket`` (§4.1, the client's checks 2-4)."""
    accepts = [v.strip() for n, v in response_headers if n.lower() == b"sec-websocket-accept"]
    return accepts == [accept_for(key)] and _tokens(response_headers, b"upgrade") == {b"websocket"}


def close_frame(code: int, mask: bytes | None = None) -> bytes:
    """A Close frame with ``code`` and no reason: unmasked (server to client) or masked with the
    4-byte ``mask`` (client to server, §5.3)."""
    payload = struct.pack("!H", code)
    if mask is None:
        return b"\x88\x02" + payload
    return b"\x88\x82" + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


def _header_length(b1: int) -> int:
    """How long a frame header is, from its second byte (§5.2: the payload length's form, and the
    4-byte mask when the mask bit is set)."""
    short = b1 & 0x7F
    return (2 if short < 126 else 4 if short == 126 else 10) + (4 if b1 & 0x80 else 0)


class FrameTracker:
    """Follows the frames of one direction of a tunnel: :meth:`feed` every chunk relayed, in order.

    ``at_boundary`` is true between frames; ``error`` is set (and the tracker stops) on a 64-bit
    length with its most significant bit set (§5.2). ``closed`` is set once a Close frame's header
    was seen. Control frames interleaved in a fragmented message are frames like any other here.
    """

    __slots__ = ("_head", "_remaining", "closed", "error")

    def __init__(self) -> None:
        self._head = b""  # the bytes of a header still incomplete
        self._remaining = 0  # payload bytes of the current frame still to come
        self.error = False
        self.closed = False

    @property
    def at_boundary(self) -> bool:
        return not self._head and not self._remaining and not self.error

    def feed_to_boundary(self, data: bytes) -> int:
        """Feed ``data`` up to the first frame boundary; return how many bytes that took (all of
        ``data`` when no frame ends in it: then ``at_boundary`` is false). Steps through a header
        byte by byte (at most 14) and through a payload at once."""
        pos, end = 0, len(data)
        while pos < end and not self.at_boundary and not self.error:
            step = min(self._remaining, end - pos) if self._remaining and not self._head else 1
            self.feed(data[pos : pos + step])
            pos += step
        return pos

    def feed(self, data: bytes) -> None:
        if self.error:
            return
        end = len(data)
        if not self._head and not self._remaining and end >= 2 and data[1] & 0x7F < 126:
            # The common case, one whole small frame in the chunk: no loop.
            b1 = data[1]
            if _header_length(b1) + (b1 & 0x7F) == end:
                if data[0] & 0x0F == 0x8:
                    self.closed = True
                return
        pos = 0
        if self._head:  # a header split across reads: complete it first
            head = self._head + data[:14]
            if len(head) < 2 or len(head) < (need := _header_length(head[1])):
                self._head = head  # all of data: it ends before the header does
                return
            pos = need - len(self._head)
            self._head = b""
            if not self._frame(head, 0, need):
                return
        remaining = self._remaining
        while True:
            left = end - pos
            if remaining >= left:
                self._remaining = remaining - left
                return
            pos += remaining
            left -= remaining
            remaining = 0
            if left < 2:
                self._head = data[pos:]
                self._remaining = 0
                return
            need = _header_length(data[pos + 1])
            if left < need:
                self._head = data[pos:]
                self._remaining = 0
                return
            if not self._frame(data, pos, need):
                return
            pos += need
            remaining = self._remaining

    def _frame(self, data: bytes, pos: int, need: int) -> bool:
        """A whole header at ``data[pos:pos + need]``: set ``_remaining`` to its payload length.
        False (and ``error``) for a 64-bit length with its top bit set."""
        short = data[pos + 1] & 0x7F
        if short < 126:
            length = short
        elif short == 126:
            length = (data[pos + 2] << 8) | data[pos + 3]
        else:
            length = int.from_bytes(data[pos + 2 : pos + 10], "big")
            if length >> 63:
                self.error = True
                return False
        if data[pos] & 0x0F == 0x8:
            self.closed = True
        self._remaining = length
        return True
