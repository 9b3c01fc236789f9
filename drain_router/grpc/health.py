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
