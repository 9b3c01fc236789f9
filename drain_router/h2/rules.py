"""What a relayed HTTP/2 stream may carry, and the bounds of a connection (RFC 9113 §8).
Pure: no I/O; table-tested.

Header lists are HPACK-decoded ``(name, value)`` byte pairs. A request that breaks a rule of §8.2-8.3
is malformed: the stream is reset with PROTOCOL_ERROR and never reaches the model server. A response
that breaks one is the model server's error: the call ends UNAVAILABLE for the client.
"""

from __future__ import annotations

import re
from typing import Final

#: Concurrent streams a client connection may open (SETTINGS_MAX_CONCURRENT_STREAMS), lowered to the
#: model server's own limit once it is known (a client must never be allowed more streams than one
#: upstream connection takes). 100 is the floor RFC 9113 §6.5.2 recommends and gRPC's usual value.
MAX_CONCURRENT_STREAMS: Final = 100
#: The decoded header list a stream may carry (SETTINGS_MAX_HEADER_LIST_SIZE; name + value + 32 per
#: field, as HPACK counts it). Envoy's default is 60 KiB, gRPC's metadata limit 8-16 KiB.
MAX_HEADER_LIST_BYTES: Final = 32 * 1024
#: The compressed header block across HEADERS and CONTINUATION frames: past it the connection is cut
#: (the CONTINUATION flood of 2024, where servers buffered blocks without end).
MAX_HEADER_BLOCK_BYTES: Final = MAX_HEADER_LIST_BYTES
#: The HPACK dynamic table the router's decoders keep (SETTINGS_HEADER_TABLE_SIZE, the default).
HEADER_TABLE_BYTES: Final = 4096
#: The flow-control window of one stream in each direction: at most this much of a stream waits in
#: the router for a slow reader (the window is re-opened to one side only as the other side takes
#: the bytes), so memory per stream is bounded whatever the peers do: a client that stops reading
#: holds at most this per stream (plus a share of the transport's high-water mark), 6.4 MiB for a
#: connection's 100 streams. HTTP/2's default window; a window is re-opened a quarter at a time.
STREAM_WINDOW: Final = 64 * 1024
#: The connection window the router opens to each peer; re-opened as soon as bytes arrive (the
#: per-stream windows bound what waits), so one stalled stream never blocks the others.
CONNECTION_WINDOW: Final = 16 * 1024 * 1024
#: Rates past which a client connection gets GOAWAY ENHANCE_YOUR_CALM: (burst, per second).
#: Rapid reset (CVE-2023-44487) is streams reset by the client, or reset or refused by the router
#: because of what the client sent, at a rate no real client needs; SETTINGS and PING floods make
#: the router answer frame for frame.
RESETS: Final = (200, 100.0)
SETTINGS_FRAMES: Final = (50, 10.0)
PINGS: Final = (50, 10.0)
#: Frames that cost work without progress: PRIORITY, WINDOW_UPDATE and DATA that is empty and does
#: not end its stream. A client earns more of them by what it is relayed: each DATA frame the
#: router sends it (answered by a WINDOW_UPDATE for the stream and one for the connection) and each
#: stream it opens (a PRIORITY or two with it); past the burst and the rate, GOAWAY ENHANCE_YOUR_CALM.
IDLE_FRAMES: Final = (1000, 100.0)
IDLE_FRAMES_PER_DATA_SENT: Final = 2
IDLE_FRAMES_PER_STREAM: Final = 4
#: Output queued for a client that does not read, other than relayed DATA (which the windows bound):
#: control frames and header blocks. Past it, while the transport is paused, the connection is cut.
MAX_QUEUED_OUTPUT_BYTES: Final = 4 * 1024 * 1024
#: Closed streams a connection remembers with how they closed (streams.ClosedStreams: at least this
#: many, at most twice): more than RESETS' burst, so a frame in flight across any reset the router
#: sent before a client is cut is known as such; one on a stream forgotten since is a stream error.
REMEMBERED_CLOSED_STREAMS: Final = 256

_CONNECTION_SPECIFIC: Final = frozenset(
    (b"connection", b"proxy-connection", b"keep-alive", b"transfer-encoding", b"upgrade")
)
_REQUEST_PSEUDO: Final = frozenset((b":method", b":scheme", b":path", b":authority"))
_NAME: Final = re.compile(rb"^[!#$%&'*+\-.^_`|~0-9a-z]+$")
_BAD_VALUE: Final = re.compile(rb"[\x00\r\n]|^[ \t]|[ \t]$")
_SCHEME: Final = re.compile(rb"^[A-Za-z][A-Za-z0-9+.\-]*$")
_BAD_AUTHORITY: Final = re.compile(rb"[\x00-\x20\x7f]")
_TIMEOUT: Final = re.compile(rb"^([0-9]{1,8})([HMSmun])$")
_TIMEOUT_UNITS: Final = {b"H": 3600.0, b"M": 60.0, b"S": 1.0, b"m": 1e-3, b"u": 1e-6, b"n": 1e-9}

Headers = list[tuple[bytes, bytes]]


class Malformed(ValueError):
    """A header list that breaks RFC 9113 §8: the message says which rule."""


def _field(name: bytes, value: bytes) -> None:
    if not _NAME.match(name):
        raise Malformed(f"invalid field name {name[:64]!r} (names are lowercase tokens)")
    if name in _CONNECTION_SPECIFIC:
        raise Malformed(f"connection-specific field {name.decode()} (RFC 9113 §8.2.2)")
    if _BAD_VALUE.search(value):
        raise Malformed(f"invalid value for {name.decode()} (NUL, CR, LF or edge whitespace)")
    if name == b"te" and value != b"trailers":
        raise Malformed("te other than trailers")


def _content_length(value: bytes, known: int) -> int:
    """A ``content-length`` value, checked against one seen before in the same list (-1: none)."""
    if not value.isdigit() or len(value) > 18:
        raise Malformed("content-length is not a number")
    length = int(value)
    if known not in (-1, length):
        raise Malformed("content-length given twice with different values")
    return length


class Request:
    """What the router needs of a checked request head, read in the same pass as the check."""

    __slots__ = ("grpc", "length", "path", "timeout")

    def __init__(self, path: bytes, length: int, grpc: bool, timeout: float | None) -> None:
        self.path = path
        self.length = length
        """Its ``content-length`` (-1: none)."""
        self.grpc = grpc
        """A gRPC call (``content-type: application/grpc[+proto|;...]``): ended with gRPC trailers,
        not a reset."""
        self.timeout = timeout
        """Its ``grpc-timeout`` in seconds (gRPC PROTOCOL-HTTP2: 1-8 digits and a unit), or None."""


def request(headers: Headers) -> Request:
    """Check a request's header list (§8.3.1). Raises :class:`Malformed`."""
    pseudo: dict[bytes, bytes] = {}
    regular = False
    length = -1
    host = None
    grpc = False
    timeout = None
    for name, value in headers:
        if name[:1] == b":":
            if regular:
                raise Malformed("pseudo-header after a regular field")
            if name not in _REQUEST_PSEUDO:
                raise Malformed(f"unknown pseudo-header {name[:32]!r}")
            if name in pseudo:
                raise Malformed(f"repeated {name.decode()}")
            pseudo[name] = value
            continue
        regular = True
        _field(name, value)
        if name == b"content-type":
            grpc = value.startswith(b"application/grpc")
        elif name == b"grpc-timeout":
            timeout = _grpc_timeout(value)
        elif name == b"content-length":
            length = _content_length(value, length)
        elif name == b"host":
            host = value
    method = pseudo.get(b":method")
    if method is None or not method or not _NAME.match(method.lower()):
        raise Malformed("missing or invalid :method")
    if method == b"CONNECT":
        raise Malformed("CONNECT is not relayed")
    scheme = pseudo.get(b":scheme")
    if not scheme or not _SCHEME.match(scheme):
        raise Malformed("missing or invalid :scheme")
    path = pseudo.get(b":path")
    if not path or _BAD_VALUE.search(path) or b" " in path:
        raise Malformed("missing or invalid :path")
    authority = pseudo.get(b":authority")
    if authority is not None and (not authority or _BAD_AUTHORITY.search(authority)):
        raise Malformed("invalid :authority (empty, or a control character or space)")
    if host is not None and authority is not None and host != authority:
        raise Malformed("host differs from :authority (RFC 9113 §8.3.1)")
    return Request(path, length, grpc, timeout)


def response(headers: Headers) -> tuple[int, int]:
    """Check a response head from the model server (§8.3.2); returns its status and its
    ``content-length`` (-1: none)."""
    if not headers or headers[0][0] != b":status":
        raise Malformed("a response head must start with :status")
    status = headers[0][1]
    if len(status) != 3 or not status.isdigit():
        raise Malformed("invalid :status")
    length = -1
    for name, value in headers[1:]:
        if name[:1] == b":":
            raise Malformed(f"pseudo-header {name[:32]!r} in a response")
        _field(name, value)
        if name == b"content-length":
            length = _content_length(value, length)
    return int(status), length


#: Statuses whose responses have no content whatever their ``content-length`` says (RFC 9110 §6.4.1,
#: §15.3.5, §15.4.5): 204 No Content and 304 Not Modified. So has every response to HEAD.
NO_CONTENT_STATUSES: Final = frozenset((204, 304))


def asks_head(headers: Headers) -> bool:
    """A request head (as this end sends it) with ``:method: HEAD``: its response has no content."""
    for name, value in headers:
        if name == b":method":
            return value == b"HEAD"
        if name[:1] != b":":
            return False
    return False


def content_owed(status: int, length: int, head: bool) -> int:
    """What a final response's DATA must add up to (RFC 9113 §8.1.1), or -1 for no check: nothing
    for the response to a HEAD request (``head``) and for 204 and 304, whatever ``content-length``
    says (§8.1.1 lets them carry a non-zero one with no content); else its ``content-length``
    (``length``, -1: none). A response that carries more, or ends short, is malformed."""
    if head or status in NO_CONTENT_STATUSES:
        return 0
    return length


def trailers(headers: Headers) -> None:
    """Check a trailer section (§8.1): regular fields only, each as in a head."""
    for name, value in headers:
        if name[:1] == b":":
            raise Malformed(f"pseudo-header {name[:32]!r} in trailers")
        _field(name, value)


def _grpc_timeout(value: bytes) -> float | None:
    match = _TIMEOUT.match(value)
    if match is None:
        return None
    return int(match.group(1)) * _TIMEOUT_UNITS[match.group(2)]


def grpc_status(headers: Headers) -> str | None:
    """The ``grpc-status`` a header list carries (trailers, or a trailers-only response), or None."""
    for name, value in headers:
        if name == b"grpc-status":
            return value.decode("latin-1") if value.isdigit() else None
    return None


class Budget:
    """A token bucket: ``burst`` events at once, refilled at ``rate`` per second and by what the peer
    earned (a running total passed in, so earning costs the hot path nothing). Time is passed in."""

    __slots__ = ("_at", "_earned", "_rate", "_tokens", "burst")

    def __init__(self, limits: tuple[int, float], now: float) -> None:
        self.burst, self._rate = limits
        self._tokens = float(self.burst)
        self._at = now
        self._earned = 0

    def spend(self, now: float, earned: int = 0) -> bool:
        """Count one event; False once the rate is exceeded. ``earned``: the running total of tokens
        the peer earned so far (only its growth since the last call counts)."""
        gained = (now - self._at) * self._rate + (earned - self._earned)
        self._tokens = min(self.burst, self._tokens + gained)
        self._at = now
        self._earned = earned
        if self._tokens < 1.0:
            return False
        self._tokens -= 1.0
        return True


class Budgets:
    """A connection's budgets for frames that cost work without progress: a client's are this
    module's limits, the model server's are unlimited."""

    __slots__ = ("idle", "pings", "resets", "settings")

    def __init__(self, now: float, *, limited: bool = True) -> None:
        def budget(limits: tuple[int, float]) -> Budget:
            return Budget(limits if limited else (2**62, 0.0), now)

        self.resets = budget(RESETS)
        self.settings = budget(SETTINGS_FRAMES)
        self.pings = budget(PINGS)
        self.idle = budget(IDLE_FRAMES)


#: W3C trace context (``--tracing``): the client's is replaced by the router's span (:func:`traced`).
TRACE_CONTEXT: Final = frozenset((b"traceparent", b"tracestate"))


def traced(headers: Headers, traceparent: bytes, tracestate: bytes | None) -> Headers:
    """A request's HEADERS as they go upstream with tracing on: the client's ``traceparent`` and
    ``tracestate`` replaced by the router's span's (one of each, last), everything else as it came."""
    out = [(name, value) for name, value in headers if name not in TRACE_CONTEXT]
    out.append((b"traceparent", traceparent))
    if tracestate:
        out.append((b"tracestate", tracestate))
    return out
