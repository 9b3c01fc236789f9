"""gRPC status codes: the one enumeration the router, its admission control, the activator and the
traces share (https://grpc.github.io/grpc/core/md_doc_statuscodes.html).

Purely data: no I/O. An ``IntEnum``: a member is its code wherever an ``int`` is expected, and its
``str()`` is the decimal code, as the ``grpc-status`` trailer carries it.
"""

from __future__ import annotations

import enum
from typing import Final


class GrpcStatus(enum.IntEnum):
    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16


#: The statuses a server span reports as an error (OpenTelemetry's RPC semantic conventions).
SERVER_ERRORS: Final = frozenset(
    {
        GrpcStatus.UNKNOWN,
        GrpcStatus.DEADLINE_EXCEEDED,
        GrpcStatus.UNIMPLEMENTED,
        GrpcStatus.INTERNAL,
        GrpcStatus.UNAVAILABLE,
        GrpcStatus.DATA_LOSS,
    }
)
