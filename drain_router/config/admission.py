"""The admission section of the settings tree (:class:`AdmissionSettings`): at most N requests,
sessions and gRPC streams in flight to the model server, the rest waiting first-in first-out in a
bounded queue for a bounded time (SPEC 4). Off unless ``--max-concurrent-requests`` is set.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from drain_router.config.values import Flag, integer, required_seconds, setting

DEFAULT_QUEUE_SIZE = 256
DEFAULT_QUEUE_TIMEOUT_SECS = 60


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class AdmissionSettings:
    TITLE: ClassVar[str] = "Admission control"
    """The heading of this section's flags in ``serve --help``."""

    max_concurrent_requests: int = setting(
        0,
        Flag(
            name="max-concurrent-requests",
            metavar="N",
            parse=integer(minimum=0),
            help="At most N proxied requests, WebSocket sessions and gRPC streams in flight to the model "
            "server; the rest wait in the queue. Size it at the engine's own batch limit (vLLM "
            "--max-num-seqs, SGLang --max-running-requests). 0 = no limit.",
        ),
    )
    queue_size: int = setting(
        DEFAULT_QUEUE_SIZE,
        Flag(
            name="queue-size",
            metavar="N",
            parse=integer(minimum=0),
            help="With --max-concurrent-requests: at most N requests wait, first-in first-out; one more is "
            "answered 429 with Retry-After. 0: none waits.",
        ),
    )
    queue_timeout_secs: int = setting(
        DEFAULT_QUEUE_TIMEOUT_SECS,
        Flag(
            name="queue-timeout-secs",
            metavar="SECS",
            parse=required_seconds(minimum=1),
            help="With --max-concurrent-requests: a request that waited this long is answered 503 with "
            "Retry-After. Keep it at most --shutdown-drain-secs: closing answers the queue at once.",
        ),
    )
