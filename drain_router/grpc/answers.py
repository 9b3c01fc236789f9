"""What the router writes itself on a gRPC call it ends, rather than relays: the statuses, their
messages, and the header lists that carry them. Pure: no I/O."""

from __future__ import annotations

from typing import Final

Headers = list[tuple[bytes, bytes]]

DEADLINE_MESSAGE: Final = "the router's drain deadline was reached (the pod is terminating); retry on another replica"
UPSTREAM_LOST_MESSAGE: Final = "the model server's connection was lost"
UNREACHABLE_MESSAGE: Final = "the model server is unreachable"
INVALID_MESSAGE: Final = "the model server sent an invalid response"
TIMEOUT_MESSAGE: Final = "deadline exceeded"


def response_head() -> Headers:
    return [(b":status", b"200"), (b"content-type", b"application/grpc")]


def trailers(status: int, text: str = "") -> Headers:
    """The trailers of a call the router ends itself: ``grpc-status`` and, when given, the message
    (percent-encoded as gRPC requires for bytes outside printable ASCII)."""
    out = [(b"grpc-status", str(status).encode())]
    if text:
        out.append((b"grpc-message", percent_encode(text)))
    return out


def ending(status: int, text: str, *, head_sent: bool) -> Headers:
    """The trailers that end a call with ``status``: a trailers-only response before any head."""
    end = trailers(status, text)
    return end if head_sent else response_head() + end


def percent_encode(text: str) -> bytes:
    return b"".join(bytes((b,)) if 0x20 <= b <= 0x7E and b != 0x25 else b"%%%02X" % b for b in text.encode("utf-8"))
