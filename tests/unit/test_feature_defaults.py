"""Turning a feature on with its defaults adds no advisory: for admission control, the model
server's health path, the gRPC listener and tracing, each on with nothing else said about it (and
all of them at once), over drains and declared graces on both sides of every edge the advisories
have, the advisories are exactly those of the same configuration without the feature. Defaults that
contradict each other would be a warning nobody can act on but by overriding a default.

The advisories that stay are the configuration's own: DRAIN_CONSUMES_GRACE for an undeclared grace
(the seed's), DRAIN_SHORTER_THAN_PROBE_WINDOW for a declared probe."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from drain_router import config

UPSTREAM = "http://127.0.0.1:8000"

#: Each feature turned on with its defaults: only what switches it on is given.
FEATURES: dict[str, dict[str, object]] = {
    "admission": {"max_concurrent_requests": 4},
    "upstream-health": {"upstream_health_path": "/health"},
    "grpc": {"grpc_port": 50051, "grpc_upstream": "http://127.0.0.1:50052"},
    "tracing": {"tracing": True},
}
FEATURES["all"] = {k: v for feature in list(FEATURES.values()) for k, v in feature.items()}

DRAINS = (0, 1, 2, 7, 8, 9, 17, 29, 30, 31, 60, 61, 120, 1800)
#: None: undeclared (the Kubernetes default, 30, is assumed).
GRACES = (None, 1, 17, 30, 31, 60, 120, 1802, 3600)
#: (period, failure threshold) of a declared probe, or none.
PROBES = (None, (5, 3))


def advisories(raw: dict[str, object]) -> list[dict[str, Any]]:
    return [a.as_dict() for a in config.advisories(config.build_config(upstream=UPSTREAM, **raw))]


def base(drain: int, grace: int | None, probe: tuple[int, int] | None) -> dict[str, object]:
    raw: dict[str, object] = {"shutdown_drain_secs": drain}
    if grace is not None:
        raw["termination_grace_secs"] = grace
    if probe is not None:
        raw["readiness_probe_period_secs"], raw["readiness_probe_failure_threshold"] = probe
    return raw


@pytest.mark.parametrize("feature", FEATURES)
def test_a_feature_on_with_its_defaults_adds_no_advisory(feature: str) -> None:
    differ = []
    for drain, grace, probe in itertools.product(DRAINS, GRACES, PROBES):
        without = advisories(base(drain, grace, probe))
        with_it = advisories(base(drain, grace, probe) | FEATURES[feature])
        if with_it != without:
            differ.append(f"drain {drain}, grace {grace}, probe {probe}: {[a['code'] for a in with_it]}")
    assert not differ, f"{feature} on with its defaults adds advisories:\n" + "\n".join(differ)


def test_the_seeds_undeclared_grace_advisory_stays() -> None:
    """The table is not silent by accident: the configuration's own advisories are still there, with
    every feature on."""
    codes = [a["code"] for a in advisories(base(30, None, (10, 3)) | FEATURES["all"])]
    assert codes == ["DRAIN_CONSUMES_GRACE", "DRAIN_SHORTER_THAN_PROBE_WINDOW"]


@pytest.mark.parametrize(
    ("raw", "code"),
    [
        pytest.param(
            {"max_concurrent_requests": 4, "queue_timeout_secs": 31}, "QUEUE_TIMEOUT_EXCEEDS_DRAIN", id="queue"
        ),
        pytest.param(
            {"upstream_health_path": "/health", "upstream_health_interval_secs": 10},
            "UPSTREAM_HEALTH_SLOWER_THAN_DRAIN",
            id="health",
        ),
    ],
)
def test_an_explicit_value_that_contradicts_the_drain_still_warns(raw: dict[str, object], code: str) -> None:
    codes = [a["code"] for a in advisories(base(30, 120, None) | raw)]
    assert codes == [code]
