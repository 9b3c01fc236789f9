"""The sections of the settings tree but the drain's (:mod:`.shutdown`): what the router serves
(the traffic and gRPC listeners, the model server, the admin listener), the model server's health
and the logs. One frozen dataclass per section, each setting declared once as a field with its
flag, default, help and parser (:func:`setting`).

:class:`~drain_router.config.tree.Config` holds the sections and lists their settings for the CLI.
Durations are whole seconds in ``int`` fields named ``*_secs`` (admission control's queue timeout,
which takes fractions, is in :mod:`.admission`).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar, Literal

from drain_router.config.flags import Flag, setting
from drain_router.config.values import (
    Upstream,
    boolean,
    choice,
    integer,
    optional_upstream,
    path,
    port,
    required_seconds,
    text,
    upstream,
)
from drain_router.decisions import health

DEFAULT_MAX_REQUEST_BODY_BYTES = 100 * 1024 * 1024

#: Behind a gateway a request head arrives in one packet; a client that takes longer is either
#: broken or a slowloris. nginx's client_header_timeout is 60 s for clients on the open internet.
DEFAULT_CLIENT_HEADER_TIMEOUT_SECS = 10

#: The health polling's defaults, defined beside the advisory that compares against them
#: (decisions import nothing of ours): a poll every 2 s, each allowed 2 s (what one was allowed before
#: it had a flag; above the Kubernetes probe default of 1 s, because an engine's health handler can
#: wait behind a model lock under load), 3 failures before unhealthy (as a Kubernetes probe's
#: failureThreshold: one slow or failed answer is not an outage).
DEFAULT_UPSTREAM_HEALTH_INTERVAL_SECS = health.DEFAULT_INTERVAL_SECS
DEFAULT_UPSTREAM_HEALTH_TIMEOUT_SECS = health.DEFAULT_TIMEOUT_SECS
DEFAULT_UPSTREAM_HEALTH_FAILURE_THRESHOLD = health.DEFAULT_FAILURE_THRESHOLD

#: Above every common load balancer's own pool idle timeout (AWS ALB 60 s, nginx 60 s, GCP's 600 s),
#: so the balancer closes an idle pooled connection before the router does and no request races the
#: close. nginx's keepalive_timeout is 75 s; Envoy's idle_timeout is 1 h.
DEFAULT_CLIENT_KEEPALIVE_TIMEOUT_SECS = 650

LOG_FORMATS = ("json", "console")
LOG_LEVELS = ("debug", "info", "warning", "error")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ProxySettings:
    TITLE: ClassVar[str] = "Traffic listener and model server"
    """The heading of this section's flags in ``serve --help``."""

    upstream: Upstream = setting(
        dataclasses.MISSING,
        Flag(
            name="upstream",
            metavar="URL",
            parse=upstream,
            help="The model server: http://HOST:PORT or unix:/path/to.sock. Requests are forwarded with "
            "their path and query unchanged.",
        ),
    )
    host: str = setting(
        "0.0.0.0", Flag(name="host", metavar="ADDRESS", parse=text, help="Main (traffic) listener address.")
    )
    port: int = setting(
        8080,
        Flag(
            name="port",
            metavar="PORT",
            parse=port,
            help="Main (traffic) listener port; point the Service here. 0 picks a free port (logged).",
        ),
    )
    upstream_connect_timeout_secs: int = setting(
        5,
        Flag(
            name="upstream-connect-timeout-secs",
            metavar="SECS",
            parse=required_seconds(minimum=1),
            help="Connect timeout to the model server (answered 504). There is no read timeout: "
            "completions stream for minutes and prefill can be silent.",
        ),
    )
    upstream_max_connections: int = setting(
        0,
        Flag(
            name="upstream-max-connections",
            metavar="N",
            parse=integer(minimum=0),
            help="Pooled keep-alive connections to the model server; 0 = no limit. A limit caps "
            "concurrent streams (excess requests queue).",
        ),
    )
    max_request_body_bytes: int = setting(
        DEFAULT_MAX_REQUEST_BODY_BYTES,
        Flag(
            name="max-request-body-bytes",
            metavar="BYTES",
            parse=integer(minimum=0),
            help="Larger request bodies are answered 413.",
        ),
    )
    client_header_timeout_secs: int = setting(
        DEFAULT_CLIENT_HEADER_TIMEOUT_SECS,
        Flag(
            name="client-header-timeout-secs",
            metavar="SECS",
            parse=required_seconds(minimum=1),
            help="A client's request head must arrive whole within this long (from the connection opening, "
            "or from its first byte on a reused connection), else the connection is closed: bounds "
            "slowloris clients. Never applies to request bodies or streaming responses. On the gRPC "
            "port: the connection preface and SETTINGS, else GOAWAY and close.",
        ),
    )
    client_keepalive_timeout_secs: int = setting(
        DEFAULT_CLIENT_KEEPALIVE_TIMEOUT_SECS,
        Flag(
            name="client-keepalive-timeout-secs",
            metavar="SECS",
            parse=required_seconds(minimum=1),
            help="Close a client's keep-alive connection after this long with no request. Keep it above "
            "your load balancer's own idle timeout for pooled connections (AWS ALB 60, GCP 600), so "
            "the balancer always closes first and no pooled request races the close. On the gRPC "
            "port: a connection with no open stream for this long gets GOAWAY and is closed.",
        ),
    )


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class GrpcSettings:
    TITLE: ClassVar[str] = "gRPC listener (h2c)"
    """The heading of this section's flags in ``serve --help``."""

    port: int | None = setting(
        None,
        Flag(
            name="grpc-port",
            metavar="PORT",
            parse=integer(minimum=0, maximum=65535, optional=True),
            help="A second traffic listener for gRPC over cleartext HTTP/2 (prior knowledge; point the "
            "Service's h2c port here); needs --grpc-upstream. Streams count in flight like requests; at "
            "closing clients get GOAWAY and retry elsewhere. 0 picks a free port (logged).",
        ),
    )
    upstream: Upstream | None = setting(
        None,
        Flag(
            name="grpc-upstream",
            metavar="URL",
            parse=optional_upstream,
            help="The model server's gRPC port: http://HOST:PORT or unix:/path/to.sock (h2c); needs --grpc-port.",
        ),
    )


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class AdminSettings:
    TITLE: ClassVar[str] = "Admin listener"
    """The heading of this section's flags in ``serve --help``."""

    host: str = setting(
        "0.0.0.0", Flag(name="admin-host", metavar="ADDRESS", parse=text, help="Admin listener address.")
    )
    port: int = setting(
        9091,
        Flag(
            name="admin-port",
            metavar="PORT",
            parse=port,
            help="Admin listener port: /livez, /readyz, /metrics, /admin/*. The model server's preStop "
            "hook calls /admin/drain-wait here. Must differ from --port.",
        ),
    )
    engine_metrics_path: str | None = setting(
        "/metrics",
        Flag(
            name="engine-metrics-path",
            metavar="PATH",
            parse=path,
            help="The model server's own metrics path, relayed uncounted at the admin listener's "
            "/engine/metrics (bounded in size and time). Scrape the engine there: a scrape of the "
            "traffic port is a proxied request, counted and resetting the idle clock. Empty disables "
            "(/engine/metrics answers 404).",
        ),
    )


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class HealthSettings:
    TITLE: ClassVar[str] = "Model server health"
    """The heading of this section's flags in ``serve --help``."""

    upstream_health_path: str | None = setting(
        None,
        Flag(
            name="upstream-health-path",
            metavar="PATH",
            parse=path,
            help="When set (e.g. /health), /readyz also needs the model server to answer 2xx there; the "
            "router stays 'starting' until it first does.",
        ),
    )
    upstream_health_interval_secs: int = setting(
        DEFAULT_UPSTREAM_HEALTH_INTERVAL_SECS,
        Flag(
            name="upstream-health-interval-secs",
            metavar="SECS",
            parse=required_seconds(minimum=1),
            help="How often the upstream health path is polled: a poll starts every SECS (at once "
            "after one that took longer).",
        ),
    )
    upstream_health_timeout_secs: int = setting(
        DEFAULT_UPSTREAM_HEALTH_TIMEOUT_SECS,
        Flag(
            name="upstream-health-timeout-secs",
            metavar="SECS",
            parse=required_seconds(minimum=1),
            help="A poll of the health path not answered within this long counts as a failure. 2 s: "
            "what a poll was allowed before this flag (the default interval), above the Kubernetes "
            "probe default of 1 s because an engine's health handler can wait behind a model lock "
            "under load.",
        ),
    )
    upstream_health_failure_threshold: int = setting(
        DEFAULT_UPSTREAM_HEALTH_FAILURE_THRESHOLD,
        Flag(
            name="upstream-health-failure-threshold",
            metavar="N",
            parse=integer(minimum=1),
            help="/readyz turns 503 (upstream_unavailable) only after N consecutive failed or timed-out "
            "polls, and one success brings it back, as Kubernetes probes do: a loaded engine that answers "
            "one poll late does not take the pod out of its Service. 1: the first failure.",
        ),
    )


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class LogSettings:
    TITLE: ClassVar[str] = "Logging"
    """The heading of this section's flags in ``serve --help``."""

    format: Literal["json", "console"] = setting(
        "json",
        Flag(
            name="log-format",
            parse=choice(LOG_FORMATS),
            choices=LOG_FORMATS,
            help="json: one object a line on stdout, for aggregators. console: for a terminal.",
        ),
    )
    level: str = setting(
        "info", Flag(name="log-level", parse=choice(LOG_LEVELS), choices=LOG_LEVELS, help="Minimum level logged.")
    )
    access_log: bool = setting(
        False,
        Flag(
            name="access-log",
            parse=boolean,
            kind="switch",
            help="One structured line per proxied request. Off by default: at thousands of streams it is noise.",
        ),
    )
    tracing: bool = setting(
        False,
        Flag(
            name="tracing",
            parse=boolean,
            kind="switch",
            help="OpenTelemetry spans: one per proxied request, WebSocket session and gRPC call, continuing "
            "the client's traceparent (needs the 'otel' extra). The standard OTEL_* variables configure "
            "the exporter (OTLP/HTTP), endpoint, sampler and service name.",
        ),
    )
    tracing_keep_query: bool = setting(
        False,
        Flag(
            name="tracing-keep-query",
            parse=boolean,
            kind="switch",
            help="Record each span's url.query as the client sent it. Off by default: every query-string "
            "value is recorded as REDACTED (the keys stay), because clients put API keys and tokens in "
            "URLs (?api_key=sk-...) and on, they reach the trace collector and everyone who can read it.",
        ),
    )
