"""Answers the router makes itself, as raw HTTP/1.1 bytes for the traffic listener.

Every one carries ``Server: drain-router`` (no framework or version for a scanner to match), a
``Date``, a JSON body, and static text only: never an address or an exception (the log has those).
"""

from __future__ import annotations

import json
import time
from email.utils import formatdate
from http import HTTPStatus

from drain_router import headers

#: Our own ``Server`` header value, and its line in the heads the router writes or relays.
SERVER_HEADER = "drain-router"
SERVER_LINE = b"Server: " + SERVER_HEADER.encode() + b"\r\n"

#: RFC 9110's names where Python 3.11's ``HTTPStatus`` still has RFC 7231's.
_RFC_9110_PHRASES = {413: "Content Too Large", 422: "Unprocessable Content"}
_STATUS_LINES = {
    status.value: b"HTTP/1.1 %d %s\r\n" % (status.value, _RFC_9110_PHRASES.get(status.value, status.phrase).encode())
    for status in HTTPStatus
}


def status_line(status: int) -> bytes:
    """``HTTP/1.1 <status> <standard reason phrase>`` and its CRLF, for every status the router
    writes or relays (RFC 9112 lets a client ignore the phrase; an unregistered code gets "Unknown")."""
    return _STATUS_LINES.get(status) or b"HTTP/1.1 %d Unknown\r\n" % status


CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"

Error = tuple[int, str, str]
"""A router-made error: its status, its ``error.type`` and its message (static text only)."""


def error_body(status: int, kind: str, message: str) -> bytes:
    return json.dumps({"error": {"type": kind, "message": message, "code": status}}).encode()


_date = [0, b""]


def date_header() -> bytes:
    """The ``Date`` header line, formatted at most once a second."""
    now = int(time.time())
    if now != _date[0]:
        _date[0] = now
        _date[1] = b"Date: " + formatdate(now, usegmt=True).encode() + b"\r\n"
    return _date[1]  # type: ignore[return-value]


def response(
    status: int, body: bytes, *, close: bool, head_only: bool = False, keep_alive_10: bool = False, extra: bytes = b""
) -> bytes:
    """A whole JSON response. ``head_only`` for a HEAD request (the length of the body it would
    have had, and no body); ``keep_alive_10`` for an HTTP/1.0 client that asked to keep the connection;
    ``extra``: more header lines, each ending in CRLF."""
    connection = b"Connection: close\r\n" if close else (b"Connection: keep-alive\r\n" if keep_alive_10 else b"")
    head = b"%s%s%sContent-Type: application/json\r\nContent-Length: %d\r\n%s%s\r\n" % (
        status_line(status),
        SERVER_LINE,
        date_header(),
        len(body),
        connection,
        extra,
    )
    return head if head_only else head + body


def error(
    status: int,
    kind: str,
    message: str,
    *,
    close: bool,
    keep_alive_10: bool = False,
    head_only: bool = False,
    extra: bytes = b"",
) -> bytes:
    """A router-made error; ``head_only`` for a HEAD request (its length, no body)."""
    body = error_body(status, kind, message)
    return response(status, body, close=close, keep_alive_10=keep_alive_10, head_only=head_only, extra=extra)


def refused(reason: str) -> bytes:
    """The line of :data:`~drain_router.headers.REFUSED`: ``reason`` is the answer's ``error.type``
    (``closing``, ``queue_full``, ``queue_timeout``, ``upstream_unavailable``, ``upstream_timeout``,
    ``out_of_file_descriptors``)."""
    return b"%s: %s\r\n" % (headers.REFUSED.encode(), reason.encode("ascii"))


def retry_after(seconds: int, ms: int) -> bytes:
    """The header lines of a refusal that says when to retry: ``Retry-After`` (whole seconds, RFC
    9110 §10.2.3) and ``retry-after-ms`` (what the OpenAI SDKs read first)."""
    return b"Retry-After: %d\r\nretry-after-ms: %d\r\n" % (seconds, ms)


BAD_REQUEST = (400, "bad_request", "the request is not valid HTTP/1.1")
HEAD_TOO_LARGE = (431, "request_header_too_large", "the request line or a header is too large")
BAD_TARGET = (400, "bad_request_target", "only origin-form request targets (/path?query) are proxied")
BAD_WEBSOCKET = (
    400,
    "bad_websocket_handshake",
    "a WebSocket handshake needs GET, HTTP/1.1, Sec-WebSocket-Key, Version 13 and no body",
)
UPGRADE = (501, "upgrade_not_supported", "only the websocket Upgrade token is supported (h2c: use --grpc-port)")
UNREACHABLE = (502, "upstream_unavailable", "the model server is unreachable")
CUT = (502, "upstream_unavailable", "the model server closed the response early")
BAD_RESPONSE = (502, "upstream_unavailable", "the model server sent an invalid response")
CONNECT_TIMEOUT = (504, "upstream_timeout", "connecting to the model server timed out")
OUT_OF_FDS = (503, "out_of_file_descriptors", "the router is out of file descriptors; retry on another replica")
AT_LIMIT = (503, "out_of_file_descriptors", "the router is at its connection limit; retry on another replica")


def too_large(limit: int) -> Error:
    return 413, "request_too_large", f"request body is larger than {limit} bytes"
