"""The admission control section of the settings tree (:class:`AdmissionSettings`): at most N
requests, WebSocket sessions and gRPC streams in flight to the model server, the rest waiting first
in, first out in a bounded queue for a bounded time; and the paths that never wait. What a request
gets is decided in :mod:`drain_router.decisions.capacity`."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from drain_router.config.flags import Flag, setting
from drain_router.config.shutdown import DEFAULT_SHUTDOWN_DRAIN_SECS
from drain_router.config.values import ConfigError, fractional_seconds, integer
from drain_router.decisions import capacity

#: Health and model listing on every OpenAI-compatible server (vLLM, SGLang, TGI, llama.cpp):
#: a probe or a client's discovery call must not wait behind completions.
DEFAULT_EXEMPT_PATHS = ("/health", "/v1/models")


def path_list(key: str, value: object) -> tuple[str, ...]:
    """Comma-separated absolute paths (a tuple from a test); empty: none."""
    items = value if isinstance(value, (tuple, list)) else str(value).split(",")
    paths = tuple(str(item).strip() for item in items if str(item).strip())
    for item in paths:
        if not item.startswith("/") or "?" in item:
            raise ConfigError(
                key, value, f"each path must start with '/' and have no query (got {item!r}), e.g. /health"
            )
    return paths


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
            "server (across both listeners); one past N waits first in, first out in the queue. Size it "
            "at what the engine serves without degrading (e.g. vLLM's --max-num-seqs). 0 = no limit.",
        ),
    )
    queue_size: int = setting(
        256,
        Flag(
            name="queue-size",
            metavar="Q",
            parse=integer(minimum=0),
            help="Requests that may wait for a slot; one more is answered 429 with Retry-After (gRPC: "
            "RESOURCE_EXHAUSTED with grpc-retry-pushback-ms) and never reaches the model server. 0: "
            "no queue, every request past N is refused at once.",
        ),
    )
    queue_timeout_secs: float = setting(
        # What a Config built without build_config gets (the default drain's); build_config derives
        # it from the drain given (capacity.default_queue_timeout_secs) unless the flag says otherwise.
        capacity.default_queue_timeout_secs(DEFAULT_SHUTDOWN_DRAIN_SECS),
        Flag(
            name="queue-timeout-secs",
            metavar="SECS",
            parse=fractional_seconds(optional=True),
            cli_default="",
            show_default=False,
            help="How long a request may wait for a slot, in seconds, fractions allowed (e.g. 0.5 for "
            "interactive chat); past it, 503 with Retry-After (gRPC: RESOURCE_EXHAUSTED). Keep it below "
            "your clients' and gateway's request timeouts, so the router answers before they give up. "
            f"Default: --shutdown-drain-secs, at most {capacity.DEFAULT_QUEUE_TIMEOUT_CEILING_SECS} "
            f"({capacity.DEFAULT_QUEUE_TIMEOUT_CEILING_SECS} when the drain is 0), so a request queued "
            "before SIGTERM is admitted or times out before closing.",
        ),
    )
    exempt_paths: tuple[str, ...] = setting(
        DEFAULT_EXEMPT_PATHS,
        Flag(
            name="admission-exempt-paths",
            metavar="PATHS",
            parse=path_list,
            help="Comma-separated paths whose GET and HEAD requests neither wait nor take a slot "
            "(health and model listing must not wait behind completions); --upstream-health-path is "
            "always exempt too. Exact match, query ignored. Empty: only the health path.",
        ),
    )
