"""What a parsed request head is: a probe the router answers itself, a request to proxy, or one it
refuses, and why. Pure: the client connection acts on the verdict (and logs it)."""

from __future__ import annotations

import dataclasses

from drain_router.decisions import websocket
from drain_router.http1 import answers
from drain_router.http1.heads import BadFraming, BadTarget, Headers, RequestHead, check_target, request_head

#: A request head larger than this, or with a request line or header longer than MAX_LINE_BYTES, or
#: with more than MAX_HEADERS headers, is answered 431 (aiohttp's line and count limits, and nginx's
#: total of four 8 KiB buffers).
MAX_HEAD_BYTES = 32 * 1024
MAX_LINE_BYTES = 8190
MAX_HEADERS = 128


class HeadTooLarge(Exception):
    """Raised from the parser's callback to stop parsing a head past the limits."""


PROBES = frozenset({b"/livez", b"/readyz"})
VERSIONS = frozenset({"1.0", "1.1"})
"""llhttp reports a request line without a version as HTTP/0.9: refused in HTTP/1.1."""
_WS_VERSIONS = {"1.0": (1, 0), "1.1": (1, 1)}

NO_HOST: answers.Error = (400, "bad_request", "an HTTP/1.1 request needs exactly one Host header")
NOMINATED: answers.Error = (400, "bad_request", "Connection must not name Content-Length, Transfer-Encoding or Host")


def probe_path(method: bytes, url: bytes, version: str) -> bytes | None:
    """``/livez`` or ``/readyz`` (any query) asked with GET or HEAD in HTTP/1.x, else None."""
    if (method == b"GET" or method == b"HEAD") and version in VERSIONS:
        path = url.partition(b"?")[0]
        if path in PROBES:
            return path
    return None


@dataclasses.dataclass(slots=True)
class Admission:
    """The verdict on one request head."""

    request: RequestHead | None
    """The head for the upstream, when it could be rewritten (also for some refusals: its body
    framing tells where the next request starts)."""
    problem: answers.Error | None = None
    """Why the router refuses it (answered in its turn), or None."""
    ws_key: bytes | None = None
    """A valid WebSocket handshake's ``Sec-WebSocket-Key`` (the 101 must answer it)."""
    close: bool = False
    """The connection closes after the answer: the request's framing is not to be trusted."""


def admit(
    method: bytes,
    url: bytes,
    version: str,
    headers: Headers,
    peer: bytes,
    peer_node: bytes,
    default_host: bytes,
    traced: bool = False,
) -> Admission:
    """The verdict on a head that is not a probe: origin-form target, framing decided once (no
    ``Connection`` naming a framing header), one ``Host`` in HTTP/1.1 (RFC 9112 §3.2), and a
    WebSocket handshake that is one (RFC 6455), without a body (where its frames start would be the
    upstream's guess)."""
    if version not in VERSIONS:
        return Admission(None, answers.BAD_REQUEST, close=True)
    try:
        check_target(method, url)
        request = request_head(method, url, headers, peer, peer_node, default_host, traced)
    except BadTarget:
        # The head itself is well framed: the connection goes on, except after a CONNECT (whose
        # client would start talking another protocol).
        return Admission(None, answers.BAD_TARGET, close=method == b"CONNECT")
    except BadFraming:
        return Admission(None, NOMINATED, close=True)
    hosts = request.hosts
    if hosts > 1 or (hosts == 0 and version != "1.0"):
        return Admission(request, NO_HOST, close=True)
    if not request.upgrade:
        return Admission(request)
    verdict = websocket.handshake(method, _WS_VERSIONS[version], headers)
    if verdict == websocket.BAD_HANDSHAKE or (verdict is None and (request.content_length or request.chunked)):
        return Admission(request, answers.BAD_WEBSOCKET, close=True)
    if verdict is None:
        return Admission(request, ws_key=next(v for n, v in headers if n.lower() == b"sec-websocket-key"))
    return Admission(request)  # another Upgrade token: refused 501 in its turn
