"""One frozen configuration tree, built and validated in exactly one place.

:func:`build_config` takes the raw values a user gave (strings from the command line or from
``DRAIN_ROUTER_*`` variables, or Python values from a test) and returns a :class:`Config` or raises
:class:`ConfigError` naming the flag, the value and the remedy. ``serve`` and ``check`` share it, so
``drain-router check`` refuses exactly what ``drain-router serve`` would refuse.

Durations have one representation everywhere: seconds in fields named ``*_secs``, whole (``int``)
except where a flag takes fractions (``--queue-timeout-secs``: ``float``), what asyncio's timers take. The user's text becomes seconds in exactly
one place, :func:`parse_seconds`. Each setting is declared once, as a dataclass field with its flag,
default, help and parser (:func:`flags.setting`); the CLI generates its options from them
(:func:`flags.option`), as the other commands do from their own settings.

Modules: ``sections`` (the section dataclasses), ``admission`` (admission control's), ``shutdown`` (the drain's section and its
bounds), ``tree`` (:class:`Config`, :func:`settings`: the sections' order and headings),
``values`` (:class:`ConfigError`, the upstream address and the parsers), ``flags`` (a setting's
:class:`Flag`, its variable's name and the click option built from it, for every command) and
``usage`` (how ``--help`` lists them); this package re-exports their public names and builds the
tree (:func:`build_config`, :func:`effective`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from drain_router.config.admission import DEFAULT_EXEMPT_PATHS, AdmissionSettings
from drain_router.config.flags import Flag, env_name
from drain_router.config.sections import (
    DEFAULT_CLIENT_HEADER_TIMEOUT_SECS,
    DEFAULT_CLIENT_KEEPALIVE_TIMEOUT_SECS,
    DEFAULT_MAX_REQUEST_BODY_BYTES,
    LOG_FORMATS,
    LOG_LEVELS,
    AdminSettings,
    GrpcSettings,
    HealthSettings,
    LogSettings,
    ProxySettings,
)
from drain_router.config.shutdown import (
    K8S_DEFAULT_GRACE_SECS,
    MAX_SHUTDOWN_DRAIN_SECS,
    SHUTDOWN_DEADLINE_MARGIN_SECS,
    DrainSettings,
)
from drain_router.config.tree import SECTIONS, Config, help_title, settings
from drain_router.config.values import (
    ConfigError,
    Upstream,
    flag_name,
    parse_int,
    parse_seconds,
    parse_upstream,
)
from drain_router.decisions import advisory, capacity

__all__ = [
    "DEFAULT_CLIENT_HEADER_TIMEOUT_SECS",
    "DEFAULT_CLIENT_KEEPALIVE_TIMEOUT_SECS",
    "DEFAULT_EXEMPT_PATHS",
    "DEFAULT_MAX_REQUEST_BODY_BYTES",
    "K8S_DEFAULT_GRACE_SECS",
    "LOG_FORMATS",
    "LOG_LEVELS",
    "MAX_SHUTDOWN_DRAIN_SECS",
    "SECTIONS",
    "SHUTDOWN_DEADLINE_MARGIN_SECS",
    "AdminSettings",
    "AdmissionSettings",
    "Config",
    "ConfigError",
    "DrainSettings",
    "Flag",
    "GrpcSettings",
    "HealthSettings",
    "LogSettings",
    "ProxySettings",
    "Upstream",
    "advisories",
    "build_config",
    "effective",
    "env_name",
    "flag_name",
    "help_title",
    "parse_int",
    "parse_seconds",
    "parse_upstream",
    "settings",
]


def build_config(**raw: object) -> Config:
    """Validate raw values into a :class:`Config`: keywords are the flags' names with underscores
    (``shutdown_drain_secs=30``); what is not given takes its default. Raises :class:`ConfigError`
    on the first bad value, naming its flag."""
    values: dict[str, dict[str, Any]] = {section: {} for section in SECTIONS}
    given_raw = dict(raw)  # as the user wrote them, for the messages of the checks across settings
    for section, field, flag in settings():
        if flag.key in raw:
            given = raw.pop(flag.key)
        elif field.default is dataclasses.MISSING:
            given = None
        else:
            values[section][field.name] = field.default
            continue
        assert flag.parse is not None, flag.name  # every setting of the tree is read as text
        values[section][field.name] = flag.parse(flag.key, given)
    if raw:
        raise TypeError(f"build_config() got unknown settings: {', '.join(sorted(raw))}")
    drain, proxy, admin = values["drain"], values["proxy"], values["admin"]
    if values["admission"]["queue_timeout_secs"] is None or "queue_timeout_secs" not in given_raw:
        # Not given (the CLI passes it empty): it follows the drain given.
        values["admission"]["queue_timeout_secs"] = capacity.default_queue_timeout_secs(drain["shutdown_drain_secs"])

    if drain["shutdown_drain_secs"] > MAX_SHUTDOWN_DRAIN_SECS:
        raise ConfigError(
            "shutdown_drain_secs",
            given_raw["shutdown_drain_secs"],
            f"must be at most {MAX_SHUTDOWN_DRAIN_SECS}, whatever --termination-grace-secs says: past "
            "that a value is a typo (an extra digit, or milliseconds for seconds), not a drain; the "
            "flag takes whole seconds",
        )
    period, threshold = drain["readiness_probe_period_secs"], drain["readiness_probe_failure_threshold"]
    if (period is None) != (threshold is None):
        # Named by the one given (with its value), the remedy by the one missing.
        given = "readiness_probe_period_secs" if threshold is None else "readiness_probe_failure_threshold"
        missing = "readiness_probe_failure_threshold" if threshold is None else "readiness_probe_period_secs"
        raise ConfigError(
            given,
            given_raw[given],
            f"declare {flag_name(missing)} with it: the probe window (failureThreshold * periodSeconds) "
            "is their product, and one alone says nothing",
        )
    if proxy["port"] == admin["port"] and proxy["port"] != 0:
        default_admin_port = AdminSettings().port
        other = default_admin_port if proxy["port"] != default_admin_port else default_admin_port + 1
        raise ConfigError(
            "admin_port",
            given_raw.get("admin_port", admin["port"]),
            f"must differ from --port ({proxy['port']}): probes and metrics need their own listener; "
            f"pick another port, e.g. {other}",
        )
    grpc = values["grpc"]
    if (grpc["port"] is None) != (grpc["upstream"] is None):
        given = "grpc_port" if grpc["upstream"] is None else "grpc_upstream"
        missing = "grpc_upstream" if grpc["upstream"] is None else "grpc_port"
        raise ConfigError(
            given,
            given_raw[given],
            f"declare {flag_name(missing)} with it: the gRPC listener relays to the model server's gRPC port, "
            "and one without the other has nothing to do",
        )
    if grpc["port"] is not None and grpc["port"] != 0 and grpc["port"] in (proxy["port"], admin["port"]):
        raise ConfigError(
            "grpc_port",
            given_raw["grpc_port"],
            f"must differ from --port ({proxy['port']}) and --admin-port ({admin['port']}): gRPC has its own listener",
        )
    return Config(**{section: SECTIONS[section](**fields) for section, fields in values.items()})


def advisories(cfg: Config) -> tuple[advisory.Advisory, ...]:
    """The startup advisories for this configuration (pure; see :mod:`drain_router.decisions.advisory`)."""
    return advisory.advisories(
        shutdown_drain_secs=cfg.drain.shutdown_drain_secs,
        termination_grace_secs=cfg.drain.termination_grace_secs,
        probe_period_secs=cfg.drain.readiness_probe_period_secs,
        probe_failure_threshold=cfg.drain.readiness_probe_failure_threshold,
        health_polling=None
        if cfg.health.upstream_health_path is None
        else advisory.HealthPolling(
            interval_secs=cfg.health.upstream_health_interval_secs,
            failure_threshold=cfg.health.upstream_health_failure_threshold,
            timeout_secs=cfg.health.upstream_health_timeout_secs,
        ),
        admission=advisory.Admission(
            max_concurrent_requests=cfg.admission.max_concurrent_requests,
            queue_size=cfg.admission.queue_size,
            queue_timeout_secs=cfg.admission.queue_timeout_secs,
        ),
    )


def effective(cfg: Config) -> dict[str, Any]:
    """What ``drain-router check`` prints and /admin/config answers."""
    return {"config": cfg.as_dict(), "advisories": [a.as_dict() for a in advisories(cfg)]}
