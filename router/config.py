"""One frozen configuration tree, built and validated in exactly one place.

:func:`build_config` takes the raw values a user gave (strings from the command line or from
``DRAIN_ROUTER_*`` variables, or Python values from a test) and returns a :class:`Config` or raises
:class:`ConfigError` naming the flag, the value and the remedy. ``serve`` and ``check`` share it, so
``drain-router check`` refuses exactly what ``drain-router serve`` would refuse.

Durations have one representation everywhere: whole seconds in ``int`` fields named ``*_secs``
(what the flags say and what asyncio's timers take). The user's text becomes seconds in exactly
one place, :func:`parse_seconds`.
"""

from __future__ import annotations

import dataclasses
import urllib.parse
from typing import Any, Literal

from router.decisions import advisory

#: The Kubernetes default ``terminationGracePeriodSeconds``. Assumed when the operator declares none.
K8S_DEFAULT_GRACE_SECS = 30

#: Hard ceiling for ``--shutdown-drain-secs``. A longer value is a typo (an extra digit, or
#: milliseconds for seconds), not a drain: no grace period rescues it.
MAX_SHUTDOWN_DRAIN_SECS = 1800

#: The deadline fires this many seconds before the declared grace ends, so the router can abort,
#: count and log what is left and exit 1 before the kubelet's SIGKILL takes the choice away.
SHUTDOWN_DEADLINE_MARGIN_SECS = 2

DEFAULT_MAX_REQUEST_BODY_BYTES = 100 * 1024 * 1024

#: Behind a gateway a request head arrives in one packet; a client that takes longer is either
#: broken or a slowloris. nginx's client_header_timeout is 60 s for clients on the open internet.
DEFAULT_CLIENT_HEADER_TIMEOUT_SECS = 10

#: Above every common load balancer's own pool idle timeout (AWS ALB 60 s, nginx 60 s, GCP's 600 s),
#: so the balancer closes an idle pooled connection before the router does and no request races the
#: close. nginx's keepalive_timeout is 75 s; Envoy's idle_timeout is 1 h.
DEFAULT_CLIENT_KEEPALIVE_TIMEOUT_SECS = 650

LOG_FORMATS = ("json", "console")
LOG_LEVELS = ("debug", "info", "warning", "error")


class ConfigError(ValueError):
    """A configuration value that cannot work. Names the flag, the value and the remedy."""

    def __init__(self, field: str, value: object, reason: str) -> None:
        self.field = field
        self.value = value
        self.reason = reason
        super().__init__(f"{flag_name(field)}={value!r}: {reason}")


def flag_name(field: str) -> str:
    """``shutdown_drain_secs`` -> ``--shutdown-drain-secs``."""
    return "--" + field.replace("_", "-")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Upstream:
    """Where the model server listens: TCP ``http://host:port`` or a Unix socket path."""

    url: str
    """The upstream exactly as given."""
    base_url: str
    """The URL requests are sent to (for a Unix socket, a placeholder host; the socket is the path)."""
    host: str
    """Host name for TCP upstreams; ``localhost`` for a Unix socket."""
    port: int | None
    """TCP port, ``None`` for a Unix socket."""
    unix_path: str | None = None
    """Socket path when the upstream is ``unix:/path``."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ProxySettings:
    host: str = "0.0.0.0"
    """Main (traffic) listener address."""
    port: int = 8080
    """Main (traffic) listener port; what the Service targets. 0 picks a free port (logged)."""
    upstream: Upstream
    """The model server."""
    upstream_connect_timeout_secs: int = 5
    """Connect timeout to the upstream, in seconds. There is no read timeout: a completion can stream
    for many minutes and a long prefill may be silent before the first token."""
    upstream_max_connections: int = 0
    """Pooled connections to the upstream; 0 means no limit. aiohttp's own default of 100 would
    silently cap concurrent streams at 100."""
    max_request_body_bytes: int = DEFAULT_MAX_REQUEST_BODY_BYTES
    """Larger request bodies get 413. 100 MiB fits long multimodal prompts."""
    client_header_timeout_secs: int = DEFAULT_CLIENT_HEADER_TIMEOUT_SECS
    """A request's head (request line and headers) must arrive whole within this many seconds of the
    connection opening, or of its first byte on a reused connection; else the connection is closed.
    Bounds slowloris clients. Never applies to a body or to a response that is streaming."""
    client_keepalive_timeout_secs: int = DEFAULT_CLIENT_KEEPALIVE_TIMEOUT_SECS
    """An idle keep-alive client connection (no request in progress) is closed after this long.
    Keep it above the idle timeout of the load balancer's connection pool, or a pooled request can
    race the close."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class AdminSettings:
    host: str = "0.0.0.0"
    """Admin listener address (probes, metrics, /admin/*)."""
    port: int = 9091
    """Admin listener port; the preStop hook and the controller call it."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class DrainSettings:
    shutdown_drain_secs: int = 30
    """Seconds to keep serving with /readyz 503 after SIGTERM, so endpoint removal and probe-driven
    load balancers catch up. 0 skips the pause. Equal to the Kubernetes default grace on purpose:
    a pod that has not raised its grace has nothing left for in-flight work and is told so."""
    termination_grace_secs: int | None = None
    """The pod's real terminationGracePeriodSeconds. ``None``: assume 30 for the advisory and set no
    deadline (the router cannot know the real budget and will not cut streams early)."""
    readiness_probe_period_secs: int | None = None
    """The load balancer's probe period, declared so the advisory can check the drain against it."""
    readiness_probe_failure_threshold: int | None = None
    """The load balancer's probe failure threshold."""

    def deadline_secs(self) -> int | None:
        """Seconds from the first SIGTERM at which in-flight work is aborted; ``None`` without a
        declared grace."""
        if self.termination_grace_secs is None:
            return None
        return max(self.termination_grace_secs - SHUTDOWN_DEADLINE_MARGIN_SECS, 0)

    def drain_wait_cap_secs(self) -> int:
        """Longest /admin/drain-wait hold: the declared grace, else the longest drain there can be."""
        grace = self.termination_grace_secs
        return MAX_SHUTDOWN_DRAIN_SECS if grace is None else grace

    def drain_wait_timeout_secs(self) -> int:
        """Default timeout of /admin/drain-wait: the declared grace, else the Kubernetes default."""
        grace = self.termination_grace_secs
        return K8S_DEFAULT_GRACE_SECS if grace is None else grace


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class HealthSettings:
    upstream_health_path: str | None = None
    """When set (e.g. ``/health``), /readyz also needs the model server to answer 2xx on it."""
    upstream_health_interval_secs: int = 2
    """How often the upstream health path is polled, in seconds."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class LogSettings:
    format: Literal["json", "console"] = "json"
    """``json``: one JSON object a line on stdout, for log aggregators. ``console``: for a terminal."""
    level: str = "info"
    """Minimum level logged."""
    access_log: bool = False
    """One structured line per proxied request. Off by default: at thousands of streams it is noise."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Config:
    """Everything the router needs, validated. Build it with :func:`build_config`."""

    proxy: ProxySettings
    admin: AdminSettings = AdminSettings()
    drain: DrainSettings = DrainSettings()
    health: HealthSettings = HealthSettings()
    log: LogSettings = LogSettings()

    def as_dict(self) -> dict[str, Any]:
        """The effective configuration as plain JSON-able data (for ``check`` and /admin/config)."""
        data = dataclasses.asdict(self)
        data["proxy"]["upstream"] = self.proxy.upstream.url
        data["drain"]["deadline_secs"] = self.drain.deadline_secs()
        return data


# --------------------------------------------------------------------------------------------------
# Parsing and validation: one function, one error type.


def parse_seconds(field: str, value: object, *, minimum: int = 0, optional: bool = False) -> int | None:
    """Whole seconds, at least ``minimum``. Rejects negatives, fractions and words, naming the flag."""
    if value is None or value == "":
        if optional:
            return None
        raise ConfigError(field, value, "a whole number of seconds is required")
    if isinstance(value, bool):
        raise ConfigError(field, value, "must be a whole number of seconds")
    if isinstance(value, int):
        seconds = value
    elif isinstance(value, str) and value.strip().lstrip("+-").isdigit():
        seconds = int(value.strip())
    else:
        raise ConfigError(
            field, value, "must be a whole number of seconds (no fractions or units), e.g. 30"
        )
    if seconds < minimum:
        raise ConfigError(field, value, f"must be at least {minimum} seconds")
    return seconds


def parse_int(field: str, value: object, *, minimum: int, maximum: int | None = None) -> int:
    if isinstance(value, bool):
        raise ConfigError(field, value, "must be a whole number")
    try:
        number = int(value) if isinstance(value, int) else int(str(value).strip())
    except ValueError:
        raise ConfigError(field, value, "must be a whole number") from None
    if number < minimum or (maximum is not None and number > maximum):
        bound = f"between {minimum} and {maximum}" if maximum is not None else f"at least {minimum}"
        raise ConfigError(field, value, f"must be {bound}")
    return number


def parse_upstream(value: object) -> Upstream:
    """``http://host:port`` or ``unix:/path/to.sock``; anything else is an error, never a guess."""
    remedy = "give http://HOST:PORT (e.g. http://127.0.0.1:8000) or unix:/path/to.sock"
    if not isinstance(value, str) or not value.strip():
        raise ConfigError("upstream", value, f"the model server address is required; {remedy}")
    text = value.strip()
    if text.startswith("unix:"):
        path = text[len("unix:"):]
        if path.startswith("//"):
            path = path[2:]
        if not path.startswith("/"):
            raise ConfigError("upstream", value, f"a Unix socket path must be absolute; {remedy}")
        return Upstream(url=text, base_url="http://localhost", host="localhost", port=None, unix_path=path)
    parsed = urllib.parse.urlsplit(text)
    if parsed.scheme != "http":
        raise ConfigError("upstream", value, f"only plain http upstreams are supported; {remedy}")
    try:
        port = parsed.port
    except ValueError:
        raise ConfigError("upstream", value, f"the port is not a number; {remedy}") from None
    if not parsed.hostname or port is None:
        raise ConfigError("upstream", value, f"host and port are both required; {remedy}")
    if parsed.path not in ("", "/") or parsed.query or parsed.fragment:
        raise ConfigError("upstream", value, f"no path, query or fragment: paths are forwarded as requested; {remedy}")
    host = parsed.hostname
    netloc = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return Upstream(url=text, base_url=f"http://{netloc}", host=host, port=port)


def build_config(
    *,
    upstream: object,
    host: str = "0.0.0.0",
    port: object = 8080,
    admin_host: str = "0.0.0.0",
    admin_port: object = 9091,
    shutdown_drain_secs: object = 30,
    termination_grace_secs: object = None,
    readiness_probe_period_secs: object = None,
    readiness_probe_failure_threshold: object = None,
    upstream_health_path: str | None = None,
    upstream_health_interval_secs: object = 2,
    upstream_connect_timeout_secs: object = 5,
    upstream_max_connections: object = 0,
    max_request_body_bytes: object = DEFAULT_MAX_REQUEST_BODY_BYTES,
    client_header_timeout_secs: object = DEFAULT_CLIENT_HEADER_TIMEOUT_SECS,
    client_keepalive_timeout_secs: object = DEFAULT_CLIENT_KEEPALIVE_TIMEOUT_SECS,
    log_format: str = "json",
    log_level: str = "info",
    access_log: bool = False,
) -> Config:
    """Validate raw values into a :class:`Config`. Raises :class:`ConfigError` on the first bad one."""
    drain_secs = parse_seconds("shutdown_drain_secs", shutdown_drain_secs)
    assert drain_secs is not None
    if drain_secs > MAX_SHUTDOWN_DRAIN_SECS:
        raise ConfigError(
            "shutdown_drain_secs",
            shutdown_drain_secs,
            f"must be at most {MAX_SHUTDOWN_DRAIN_SECS}; past the ceiling a value is a typo rather "
            "than a drain, and the pod would be SIGKILLed long before the pause elapsed. A long but "
            "deliberate drain is fine: declare --termination-grace-secs so startup can check it "
            "against the pod's real budget",
        )
    grace = parse_seconds("termination_grace_secs", termination_grace_secs, minimum=1, optional=True)
    probe_period = parse_seconds(
        "readiness_probe_period_secs", readiness_probe_period_secs, minimum=1, optional=True
    )
    probe_threshold = (
        None
        if readiness_probe_failure_threshold in (None, "")
        else parse_int("readiness_probe_failure_threshold", readiness_probe_failure_threshold, minimum=1)
    )
    if (probe_period is None) != (probe_threshold is None):
        missing = "readiness_probe_failure_threshold" if probe_threshold is None else "readiness_probe_period_secs"
        given = "readiness_probe_period_secs" if probe_threshold is None else "readiness_probe_failure_threshold"
        raise ConfigError(
            missing, None,
            f"declare it together with {flag_name(given)}: the probe window is their product",
        )

    main_port = parse_int("port", port, minimum=0, maximum=65535)
    adm_port = parse_int("admin_port", admin_port, minimum=0, maximum=65535)
    if main_port == adm_port and main_port != 0:
        raise ConfigError(
            "admin_port", admin_port,
            f"must differ from --port ({main_port}): probes and metrics need their own listener; "
            "pick another port, e.g. 9091",
        )

    health_path = upstream_health_path or None
    if health_path is not None and not health_path.startswith("/"):
        raise ConfigError("upstream_health_path", upstream_health_path, "must start with '/', e.g. /health")
    health_interval = parse_seconds("upstream_health_interval_secs", upstream_health_interval_secs, minimum=1)
    connect_timeout = parse_seconds("upstream_connect_timeout_secs", upstream_connect_timeout_secs, minimum=1)
    header_timeout = parse_seconds("client_header_timeout_secs", client_header_timeout_secs, minimum=1)
    keepalive_timeout = parse_seconds("client_keepalive_timeout_secs", client_keepalive_timeout_secs, minimum=1)
    assert health_interval is not None and connect_timeout is not None
    assert header_timeout is not None and keepalive_timeout is not None

    if log_format not in LOG_FORMATS:
        raise ConfigError("log_format", log_format, f"must be one of {', '.join(LOG_FORMATS)}")
    if log_level.lower() not in LOG_LEVELS:
        raise ConfigError("log_level", log_level, f"must be one of {', '.join(LOG_LEVELS)}")

    return Config(
        proxy=ProxySettings(
            host=host,
            port=main_port,
            upstream=parse_upstream(upstream),
            upstream_connect_timeout_secs=connect_timeout,
            upstream_max_connections=parse_int("upstream_max_connections", upstream_max_connections, minimum=0),
            max_request_body_bytes=parse_int("max_request_body_bytes", max_request_body_bytes, minimum=0),
            client_header_timeout_secs=header_timeout,
            client_keepalive_timeout_secs=keepalive_timeout,
        ),
        admin=AdminSettings(host=admin_host, port=adm_port),
        drain=DrainSettings(
            shutdown_drain_secs=drain_secs,
            termination_grace_secs=grace,
            readiness_probe_period_secs=probe_period,
            readiness_probe_failure_threshold=probe_threshold,
        ),
        health=HealthSettings(
            upstream_health_path=health_path,
            upstream_health_interval_secs=health_interval,
        ),
        log=LogSettings(format=log_format, level=log_level.lower(), access_log=access_log),  # type: ignore[arg-type]
    )


def advisories(cfg: Config) -> tuple[advisory.Advisory, ...]:
    """The startup advisories for this configuration (pure; see :mod:`router.decisions.advisory`)."""
    return advisory.advisories(
        shutdown_drain_secs=cfg.drain.shutdown_drain_secs,
        termination_grace_secs=cfg.drain.termination_grace_secs,
        probe_period_secs=cfg.drain.readiness_probe_period_secs,
        probe_failure_threshold=cfg.drain.readiness_probe_failure_threshold,
    )


def effective(cfg: Config) -> dict[str, Any]:
    """What ``drain-router check`` prints and /admin/config answers."""
    return {"config": cfg.as_dict(), "advisories": [a.as_dict() for a in advisories(cfg)]}
