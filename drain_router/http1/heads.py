"""What the router sends upstream and back, besides the bodies: heads, as bytes. Pure, no I/O.

Only origin-form targets are proxied (:func:`check_target`); hop-by-hop headers (RFC 9110 §7.6.1,
and any named in ``Connection``) are dropped both ways; this hop is appended to ``X-Forwarded-For``
and ``Forwarded``, ``X-Forwarded-Proto`` and ``X-Forwarded-Host`` are set, ``Host`` is kept.
"""

from __future__ import annotations

import dataclasses
import functools

from drain_router import headers as headers_mod
from drain_router.http1.answers import SERVER_LINE, status_line

Headers = list[tuple[bytes, bytes]]

#: Dropped both ways: the hop-by-hop headers, and ``Expect`` (the router answers 100-continue itself).
HOP_BY_HOP = frozenset(name.encode() for name in headers_mod.HOP_BY_HOP) | {b"expect"}
#: Replaced on the way up: the router vouches only for what it saw itself.
_REPLACED = frozenset({b"x-forwarded-for", b"forwarded", b"x-real-ip", b"x-forwarded-proto", b"x-forwarded-host"})
_SPECIAL = HOP_BY_HOP | _REPLACED | {b"host", b"content-length"}
#: W3C trace context (``--tracing``): the client's is replaced by the router's span (:func:`traced_head`).
TRACE_CONTEXT = frozenset({b"traceparent", b"tracestate"})
_SPECIAL_TRACED = _SPECIAL | TRACE_CONTEXT
#: Dropped from the upstream's response: the router's own marker of a request the model server
#: never saw (:data:`~drain_router.headers.REFUSED`) is never the model server's to give, or a tier
#: above would run again a request that was run.
OWN = frozenset({headers_mod.REFUSED.encode()})
#: Headers that frame a message (RFC 9112 §6) or name its host. The router decides framing once,
#: from the headers as parsed, so a ``Connection`` header that nominates one of them (asking the next
#: hop to drop it while its body is still sent) is refused: 400 for a request, 502 for a response.
#: Dropping ``Content-Length`` that way would make the model server read the body as a second request.
FRAMING = frozenset({b"content-length", b"transfer-encoding", b"host"})


class BadTarget(ValueError):
    """A request target that is not origin-form (CONNECT authority, absolute-form, ``*``)."""


class BadFraming(ValueError):
    """A message whose framing the router will not relay: ``Connection`` nominates a framing header,
    or a response body is framed in a way the client cannot be told about."""


def check_target(method: bytes, target: bytes) -> None:
    """Raise :class:`BadTarget` unless ``target`` is origin-form (``/path?query``) and the method is
    not CONNECT. The router writes the target after its own connection to the upstream, so an
    origin-form target can only ever name a path there (``/@evil:6443`` stays a path)."""
    if method == b"CONNECT" or not target.startswith(b"/"):
        raise BadTarget(target.decode("latin-1"))


def _named(value: bytes, into: set[bytes] | None) -> set[bytes]:
    tokens = {t.strip().lower() for t in value.split(b",") if t.strip()}
    return tokens if into is None else into | tokens


_TOKEN_CHARS = frozenset(b"!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")


@functools.lru_cache(maxsize=256)
def forwarded_node(value: bytes) -> bytes:
    """A value for RFC 7239 ``Forwarded``: an IPv6 address bracketed, anything not a token quoted."""
    if value.count(b":") > 1 and not value.startswith(b"["):
        value = b"[" + value + b"]"
    if value and all(c in _TOKEN_CHARS for c in value):
        return value
    return b'"' + value.replace(b"\\", b"\\\\").replace(b'"', b'\\"') + b'"'


@dataclasses.dataclass(slots=True)
class RequestHead:
    """What :func:`request_head` found in a client's head, and the head for the upstream. (Slots,
    not frozen: built once per request, it costs 0.12 µs more than a tuple and reads faster.)"""

    head: bytes
    """The request line and headers to write upstream, with the blank line."""
    content_length: int | None
    chunked: bool
    """The client's body is chunked: re-chunked upstream (other codings pass through)."""
    expect_continue: bool
    upgrade: bool
    hosts: int
    """How many ``Host`` headers the client sent (HTTP/1.1 needs exactly one)."""


def request_head(
    method: bytes,
    target: bytes,
    headers: Headers,
    peer: bytes,
    peer_node: bytes,
    default_host: bytes,
    traced: bool = False,
) -> RequestHead:
    """The upstream request's head. ``peer`` is the client's address, ``peer_node`` the same as
    :func:`forwarded_node` renders it (both computed once per connection); ``default_host`` is sent
    as ``Host`` when the client sent none (HTTP/1.0). ``traced`` (``--tracing``): the client's
    ``traceparent`` and ``tracestate`` are left out, for :func:`traced_head` to add the router's;
    otherwise they pass through untouched, like any end-to-end header."""
    special = _SPECIAL_TRACED if traced else _SPECIAL
    parts = [method, b" ", target, b" HTTP/1.1\r\n"]
    named: set[bytes] | None = None
    prior_xff: list[bytes] = []
    prior_fwd: list[bytes] = []
    host = None
    hosts = 0
    length = None
    transfer = None
    expect = upgrade = False
    for name, value in headers:
        lower = name.lower()
        if lower not in special:
            parts += (name, b": ", value, b"\r\n")
        elif lower == b"host":
            host = value
            hosts += 1
            parts += (name, b": ", value, b"\r\n")
        elif lower == b"content-length":
            length = int(value)
            parts += (name, b": ", value, b"\r\n")
        elif lower == b"connection":
            named = _named(value, named)
        elif lower == b"transfer-encoding":
            transfer = value if transfer is None else transfer + b", " + value
        elif lower == b"x-forwarded-for":
            prior_xff.append(value)
        elif lower == b"forwarded":
            prior_fwd.append(value)
        elif lower == b"expect":
            expect = value.strip().lower() == b"100-continue"
        elif lower == b"upgrade":
            upgrade = True
    if named and not named.isdisjoint(FRAMING):
        raise BadFraming("Connection nominates a framing header")
    if named and (named := named - HOP_BY_HOP):
        parts = parts[:4] + [
            p
            for name, value in headers
            if (lower := name.lower()) not in named and (lower not in special or lower in (b"host", b"content-length"))
            for p in (name, b": ", value, b"\r\n")
        ]
    xff = b", ".join([*prior_xff, peer])
    hop = b"for=" + peer_node + b";proto=http"
    if host is not None:
        hop += b";host=" + forwarded_node(host)
        parts += (b"X-Forwarded-Host: ", host, b"\r\n")
    else:
        parts += (b"Host: ", default_host, b"\r\n")
    parts += (b"X-Forwarded-For: ", xff, b"\r\nX-Forwarded-Proto: http\r\nForwarded: ", b", ".join([*prior_fwd, hop]))
    chunked = transfer is not None
    if chunked:
        parts += (b"\r\nTransfer-Encoding: ", transfer)  # type: ignore[arg-type]
        length = None
    parts.append(b"\r\n\r\n")
    return RequestHead(b"".join(parts), length, chunked, expect, upgrade, hosts)


def traced_head(head: bytes, traceparent: bytes, tracestate: bytes | None) -> bytes:
    """A head :func:`request_head` built with ``traced``, with the router's span as the upstream
    request's parent: one ``traceparent`` (and the ``tracestate`` passed on), after the others."""
    trace = b"traceparent: " + traceparent + b"\r\n"
    if tracestate:
        trace += b"tracestate: " + tracestate + b"\r\n"
    return head[:-2] + trace + b"\r\n"


#: Added to a WebSocket handshake on its way up, and to the 101 on its way back: ``Connection`` and
#: ``Upgrade`` are hop-by-hop, dropped with the others, and the upgrade is asked again on each hop.
UPGRADE_WEBSOCKET = b"Connection: Upgrade\r\nUpgrade: websocket\r\n\r\n"


def websocket_request(head: bytes) -> bytes:
    """The upstream head of a WebSocket handshake (:func:`request_head`'s, with the upgrade asked)."""
    return head[:-2] + UPGRADE_WEBSOCKET


def switching_head(headers: Headers) -> bytes:
    """The 101 relayed to the client: its end-to-end headers, and the upgrade to ``websocket``."""
    return interim_head(101, headers)[:-2] + UPGRADE_WEBSOCKET


#: Idempotent methods (RFC 9110 §9.2.2).
IDEMPOTENT = frozenset({b"GET", b"HEAD", b"OPTIONS", b"TRACE", b"PUT", b"DELETE"})


def retryable(method: bytes, request: RequestHead | None) -> bool:
    """A request the router may send again on a fresh connection when the pooled one it was written
    to turns out closed by the model server before any answer: idempotent and without a body (a
    body was streamed, not kept)."""
    return method in IDEMPOTENT and request is not None and not request.chunked and not request.content_length


#: Responses with a Content-Length up to this size are sent with their head in one write.
SMALL_BODY_BYTES = 64 * 1024

# How a response body is framed to the client.
NONE, LENGTH, SMALL, CHUNKED, UNTIL_CLOSE = range(5)


#: What :func:`client_head` returns (a plain tuple, as above): ``(head, mode, until_eof, close)``.
#: ``head``: the status line, headers and blank line for the client; ``mode``: how the body is framed
#: to the client (NONE, LENGTH, SMALL, CHUNKED or UNTIL_CLOSE); ``until_eof``: the upstream ends the
#: body by closing the connection; ``close``: the client connection closes after this response.
ClientHead = tuple[bytes, int, bool, bool]


def _end_to_end(headers: Headers, named: set[bytes]) -> list[bytes]:
    """The header lines of ``headers`` without the hop-by-hop ones and those ``Connection`` names."""
    return [
        p
        for name, value in headers
        if (lower := name.lower()) not in HOP_BY_HOP and lower not in named
        for p in (name, b": ", value, b"\r\n")
    ]


#: Never on a 1xx head: no interim response has a body, so none carries its framing (RFC 9110 §8.6,
#: RFC 9112 §6.1; ``Transfer-Encoding`` is hop-by-hop besides). An upstream that sends one on a
#: ``103`` would have the client's parser look for a body that never comes.
_NOT_INTERIM = frozenset({b"content-length", b"transfer-encoding"})


def interim_head(status: int, headers: Headers) -> bytes:
    """A 1xx interim response (``103 Early Hints``) as relayed to an HTTP/1.1 client (RFC 9110 §15.2):
    its end-to-end headers but its framing ones (:data:`_NOT_INTERIM`), never a body."""
    named: set[bytes] = set(_NOT_INTERIM)
    for name, value in headers:
        if name.lower() == b"connection":
            named = _named(value, named)
    return b"".join([status_line(status), *_end_to_end(headers, named), b"\r\n"])


def _codings(transfer: bytes) -> bytes:
    """The transfer codings of an upstream's ``Transfer-Encoding`` before its final ``chunked``, as
    relayed in front of the router's own. Raises :class:`BadFraming` unless ``chunked`` is the last
    coding and the only one: with another last, the body is close-delimited and still carries
    whatever framing a ``chunked`` inside left in it (RFC 9112 §6.1, §6.3), which the client could
    not be told about; no model server sends such a response, so it is a 502."""
    tokens = [t.strip() for t in transfer.split(b",") if t.strip()]
    if not tokens or [t.lower() for t in tokens].count(b"chunked") != 1 or tokens[-1].lower() != b"chunked":
        raise BadFraming(f"Transfer-Encoding {transfer[:100].decode('latin-1')!r} does not end in one chunked")
    return b", ".join(tokens[:-1])


def client_head(status: int, headers: Headers, *, head_request: bool, http10: bool, close: bool) -> ClientHead:
    """The response head for the client and how its body is framed, from the upstream's status and
    headers: hop-by-hop ones (and those named in ``Connection``) dropped, and :data:`OWN`. ``close``: the connection
    closes after it anyway (the client asked, or the router is draining). The status line carries
    the standard reason phrase. Raises :class:`BadFraming` when ``Connection`` nominates a framing
    header, when ``Transfer-Encoding`` does not end in one ``chunked`` (:func:`_codings`), or when
    the body cannot be framed for this client (a transfer coding an HTTP/1.0 client cannot be told
    about)."""
    lines = [status_line(status)]
    named: set[bytes] | None = None
    length = None
    transfer: bytes | None = None
    has_server = False
    for name, value in headers:
        lower = name.lower()
        if lower in HOP_BY_HOP:
            if lower == b"connection":
                named = _named(value, named)
            elif lower == b"transfer-encoding":
                transfer = value if transfer is None else transfer + b"," + value
            continue
        if lower in OWN:
            continue
        if lower == b"content-length":
            length = int(value)
        elif lower == b"server":
            has_server = True
        lines += (name, b": ", value, b"\r\n")
    if named and not named.isdisjoint(FRAMING):
        raise BadFraming("Connection nominates a framing header")
    if named and (named := named - HOP_BY_HOP):
        lines = [lines[0], *_end_to_end(headers, named | OWN)]
        has_server = has_server and b"server" not in named
    if not has_server:
        lines.append(SERVER_LINE)
    codings = _codings(transfer) if transfer is not None else b""
    until_eof = False
    if head_request or status == 204 or status == 304:
        mode = NONE
    elif transfer is None and length is not None:
        mode = SMALL if length <= SMALL_BODY_BYTES else LENGTH
    else:
        until_eof = transfer is None  # neither header: the body ends with the connection (RFC 9112 §6.3)
        if not http10:
            mode = CHUNKED
            lines += (b"Transfer-Encoding: ", codings + b", chunked" if codings else b"chunked", b"\r\n")
        elif codings:
            raise BadFraming("a transfer coding an HTTP/1.0 client cannot be told about")
        else:
            mode = UNTIL_CLOSE
            close = True
    if close:
        lines.append(b"Connection: close\r\n")
    elif http10:
        lines.append(b"Connection: keep-alive\r\n")
    lines.append(b"\r\n")
    return b"".join(lines), mode, until_eof, close
