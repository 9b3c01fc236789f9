"""``grpc.health.v1.Health`` as the router answers it itself (starting, draining, closing): the two
methods' paths and the messages, encoded by hand (one enum field, so the router needs no protobuf).
Pure: no I/O.
"""

from __future__ import annotations

from typing import Final

CHECK: Final = b"/grpc.health.v1.Health/Check"
WATCH: Final = b"/grpc.health.v1.Health/Watch"
PATHS: Final = frozenset((CHECK, WATCH))

#: ``HealthCheckResponse.ServingStatus``.
SERVING: Final = 1
NOT_SERVING: Final = 2


def message(status: int) -> bytes:
    """A length-prefixed gRPC message holding ``HealthCheckResponse{status}`` (field 1, varint)."""
    body = bytes((0x08, status))
    return b"\x00" + len(body).to_bytes(4, "big") + body


def response_head() -> list[tuple[bytes, bytes]]:
    return [(b":status", b"200"), (b"content-type", b"application/grpc")]


def trailers(status: int, text: str = "") -> list[tuple[bytes, bytes]]:
    """The trailers of a call the router ends itself: ``grpc-status`` and, when given, the message
    (percent-encoded as gRPC requires for bytes outside printable ASCII)."""
    out = [(b"grpc-status", str(status).encode())]
    if text:
        out.append((b"grpc-message", percent_encode(text)))
    return out


def percent_encode(text: str) -> bytes:
    return b"".join(bytes((b,)) if 0x20 <= b <= 0x7E and b != 0x25 else b"%%%02X" % b for b in text.encode("utf-8"))
