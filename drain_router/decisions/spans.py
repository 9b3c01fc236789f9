"""What a span says (``--tracing``): its name, its attributes after OpenTelemetry's stable HTTP and
RPC semantic conventions plus the router's own (``drain_router.*``), whether it is an error, and the
names of the drain's span events. Pure: the tracing adapter (:mod:`drain_router.tracing`) and the
proxy carry it out; nothing here knows the SDK.
"""

from __future__ import annotations

from typing import Final

from drain_router.decisions import grpc_status

Attributes = dict[str, str | int | float | bool]

# The drain's span events, in the order a request can meet them.
DRAIN_STARTED: Final = "drain_router.drain_started"
"""The request was in flight when the first SIGTERM arrived."""
CONNECTION_CLOSE_SENT: Final = "drain_router.connection_close_sent"
"""Its response carried ``Connection: close`` because the router is draining."""
REFUSED_CLOSING: Final = "drain_router.refused_closing"
"""Refused at closing (admission control's queue answered 503 / UNAVAILABLE)."""
DEADLINE_ABORTED: Final = "drain_router.deadline_aborted"
"""Still open at the in-flight deadline: aborted (gRPC: ``grpc-status: 14``)."""
WEBSOCKET_1001_SENT: Final = "drain_router.websocket_1001_sent"
"""The router sent the client Close 1001 (Going Away)."""
GOAWAY_SENT: Final = "drain_router.goaway_sent"
"""The client's HTTP/2 connection got the graceful GOAWAY while this call was open."""
CONTINUED: Final = "drain_router.continued"
"""The front continued this cut stream on another pod (one event per continuation)."""

EVENTS: Final = (
    DRAIN_STARTED,
    CONNECTION_CLOSE_SENT,
    REFUSED_CLOSING,
    DEADLINE_ABORTED,
    WEBSOCKET_1001_SENT,
    GOAWAY_SENT,
    CONTINUED,
)

#: Outcomes (``drain_router_requests_total``'s label) that make a span an error.
ERROR_OUTCOMES: Final = frozenset({"upstream_error", "deadline_aborted"})

#: gRPC statuses a server span reports as an error (the RPC semantic conventions).
GRPC_SERVER_ERRORS: Final = grpc_status.SERVER_ERRORS


def split_authority(authority: str, default_port: int) -> tuple[str, int]:
    """``server.address`` and ``server.port`` from a ``Host`` or ``:authority`` value (an IPv6
    literal keeps its brackets off); a missing or unparsable port is ``default_port``."""
    if authority.startswith("["):
        host, _, rest = authority[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
    elif authority.count(":") == 1:
        host, _, port = authority.partition(":")
    else:
        host, port = authority, ""
    return host, int(port) if port.isdigit() else default_port


#: What every query-string value becomes in a span unless ``--tracing-keep-query`` is set.
REDACTED: Final = "REDACTED"


def redact_query(query: str) -> str:
    """``query`` with every value replaced by :data:`REDACTED` and every key kept, in order: a
    field ``key=value`` (split on ``&``, at the first ``=``, as ``urllib.parse.parse_qsl`` splits it)
    becomes ``key=REDACTED``; a field without ``=`` is a key alone and stays. Not only the parameters
    the semantic conventions name (``sig``, ``X-Amz-Signature``...): ``api_key=sk-...``,
    ``token=...`` and whatever a client puts in its URL are credentials as often as not."""
    return "&".join(f"{field.partition('=')[0]}={REDACTED}" if "=" in field else field for field in query.split("&"))


def http_start(
    method: str,
    target: str,
    version: str,
    host: str | None,
    client: str,
    *,
    port: int,
    websocket: bool,
    keep_query: bool = False,
) -> Attributes:
    """A proxied HTTP request's (or WebSocket session's) attributes known from its head. ``host``: its
    ``Host`` header (None: it sent none); ``port``: the router's listening port; ``version``:
    ``1.0`` or ``1.1``; ``keep_query``: ``url.query`` as sent rather than redacted
    (:func:`redact_query`). No header is recorded, nor a fragment (``#`` on, which no client sends
    and which would otherwise end up in the path or in the query's last key)."""
    path, _, query = target.partition("#")[0].partition("?")
    attrs: Attributes = {
        "http.request.method": method,
        "url.path": path,
        "url.scheme": "http",
        "network.protocol.version": version,
        "drain_router.kind": "websocket" if websocket else "http",
    }
    if query:
        attrs["url.query"] = query if keep_query else redact_query(query)
    if host:
        attrs["server.address"], attrs["server.port"] = split_authority(host, port)
    if client:
        attrs["client.address"] = client
    return attrs


def grpc_start(path: str, authority: str | None, *, port: int, keep_query: bool = False) -> tuple[str, Attributes]:
    """A gRPC call's span name (``service/method``) and its attributes from ``:path`` and
    ``:authority``. A path that is not ``/service/method`` keeps its text as the name. A query in
    ``:path`` (no gRPC client sends one) is never part of the name: it is ``url.query``, redacted
    unless ``keep_query``, as for HTTP; a fragment is never recorded."""
    path, _, query = path.partition("#")[0].partition("?")
    service, slash, method = path.lstrip("/").partition("/")
    attrs: Attributes = {
        "rpc.system": "grpc",
        "network.protocol.version": "2",
        "url.scheme": "http",
        "drain_router.kind": "grpc",
    }
    if slash and service and method and "/" not in method:
        attrs["rpc.service"], attrs["rpc.method"] = service, method
        name = f"{service}/{method}"
    else:
        name = path
    if query:
        attrs["url.query"] = query if keep_query else redact_query(query)
    if authority:
        attrs["server.address"], attrs["server.port"] = split_authority(authority, port)
    return name, attrs


def ending(outcome: str, *, chunks: int, sent_bytes: int, ttfb: float | None) -> Attributes:
    """The router's own attributes, known when a request ends."""
    attrs: Attributes = {
        "drain_router.outcome": outcome,
        "drain_router.response.bytes": sent_bytes,
        "drain_router.response.chunks": chunks,
    }
    if ttfb is not None:
        attrs["drain_router.time_to_first_byte_s"] = round(ttfb, 6)
    return attrs


def http_error(outcome: str, status: int) -> str | None:
    """The span's error (its ``error.type``), or None: the model server's failures and the deadline
    (by outcome), and any 5xx the client got (the HTTP conventions for a server span)."""
    if outcome in ERROR_OUTCOMES:
        return outcome
    if status >= 500:
        return str(status)
    return None


def grpc_error(outcome: str, status: int | None) -> str | None:
    """As :func:`http_error`, with the gRPC statuses the RPC conventions count as a server's error."""
    if outcome in ERROR_OUTCOMES:
        return outcome
    if status is not None and status in GRPC_SERVER_ERRORS:
        return str(status)
    return None


# The controller's passes (INTERNAL spans), each naming its ModelService by attributes.
RECYCLE_PASS: Final = "drain_router.controller.passes.recycle_pass"
LIFECYCLE_PASS: Final = "drain_router.controller.passes.lifecycle_pass"
DELETION_PASS: Final = "drain_router.controller.deletion_pass"


def modelservice(namespace: str | None, name: str | None, uid: str | None) -> Attributes:
    """The attributes that name the ModelService a controller pass is about."""
    attrs: Attributes = {"k8s.namespace.name": namespace or "", "drain_router.modelservice.name": name or ""}
    if uid:
        attrs["drain_router.modelservice.uid"] = uid
    return attrs
