"""``activation.step``, ``holds_rules``, ``wake_replicas`` and ``retry_after`` from
``tests/cases/activation/``: the orderings of a sleep and a wake, one pass per row."""

from __future__ import annotations

from typing import Any

import pytest

from drain_router.decisions import activation, durations
from tests import casefiles

T0 = durations.parse_time("2025-01-01T00:00:00Z")

_FIELDS = {
    "phase": "phase",
    "replicasBeforeZero": "replicas_before_zero",
    "wakeRequestedAt": "wake_requested_at",
    "awokenAt": "awoken_at",
    "coldStartSeconds": "cold_start_seconds",
}
_TIMES = {"wakeRequestedAt", "awokenAt"}


def _status(data: dict[str, Any] | None) -> activation.ActivationStatus:
    data = data or {}
    return activation.ActivationStatus(
        phase=activation.Phase(data.get("phase", "Active")),
        replicas_before_zero=data.get("replicasBeforeZero"),
        wake_requested_at=None if data.get("wakeRequestedAt") is None else T0 + data["wakeRequestedAt"],
        awoken_at=None if data.get("awokenAt") is None else T0 + data["awokenAt"],
        cold_start_seconds=data.get("coldStartSeconds"),
    )


@pytest.mark.parametrize("row", casefiles.params(casefiles.load("activation/step.yaml")))
def test_step(row: dict[str, Any]) -> None:
    observed = row["observed"]
    result = activation.step(
        activation.Observed(
            endpoints=activation.Endpoints(observed["endpoints"]),
            replicas=observed["replicas"],
            router_ready=observed["ready"],
            listening=observed.get("listening", False),
            in_step=observed.get("inStep", True),
        ),
        _status(row.get("status")),
        sleep_due=row.get("sleepDue", False),
        now=T0 + row.get("now", 0),
        activation_timeout=row.get("activationTimeout", 300),
    )
    expect = row["expect"]
    assert (result.action.value if result.action else None) == expect.get("action")
    if "replicas" in expect:
        assert result.replicas == expect["replicas"]
    for key, value in (expect.get("status") or {}).items():
        got = getattr(result.status, _FIELDS[key])
        if key in _TIMES and got is not None:
            got -= T0
        assert got == value, key
    assert [e.reason for e in result.events] == expect.get("events", [])
    if "eventTypes" in expect:
        assert [e.type for e in result.events] == expect["eventTypes"]
    if "condition" in expect:
        assert result.condition is not None and result.condition.reason == expect["condition"]
        assert result.condition.status == ("True" if expect["condition"] == "Waking" else "False")


@pytest.mark.parametrize(
    ("endpoints", "ready", "replicas"),
    [(e, ready, n) for e in activation.Endpoints for ready in (False, True) for n in (0, 1, 3)],
)
@pytest.mark.parametrize("phase", list(activation.Phase))
@pytest.mark.parametrize("sleep_due", [False, True])
@pytest.mark.parametrize(("listening", "in_step"), [(False, True), (True, True), (True, False)])
def test_the_service_always_has_a_ready_endpoint(
    endpoints: activation.Endpoints,
    ready: bool,
    replicas: int,
    phase: activation.Phase,
    sleep_due: bool,
    listening: bool,
    in_step: bool,
) -> None:
    """Over every observation: the activator's endpoints are removed only on a pass that saw a pod
    Ready with its router serving; the Deployment goes to 0 only on a pass that read the activator's
    endpoints back ready (or with no Service to empty); endpoints are written only when an activator
    pod listens; nothing is done on unknown endpoints but a scale-up."""
    for wake in (None, T0 - 10, T0 - 1000):
        status = activation.ActivationStatus(phase=phase, replicas_before_zero=3, wake_requested_at=wake)
        observed = activation.Observed(
            endpoints=endpoints, replicas=replicas, router_ready=ready, listening=listening, in_step=in_step
        )
        result = activation.step(observed, status, sleep_due=sleep_due, now=T0, activation_timeout=300)
        if result.action is activation.Action.REMOVE_ACTIVATOR:
            assert ready and replicas > 0
            assert endpoints in (activation.Endpoints.ACTIVATOR, activation.Endpoints.PARTIAL)
        if result.action is activation.Action.SCALE_TO_ZERO:
            assert endpoints in (activation.Endpoints.ACTIVATOR, activation.Endpoints.NO_SERVICE)
        if result.action in (activation.Action.ADD_ACTIVATOR, activation.Action.UPDATE_ACTIVATOR):
            assert listening and endpoints is not activation.Endpoints.UNKNOWN
        if result.action is activation.Action.SCALE_UP:
            assert result.replicas is not None and result.replicas >= 1
        if endpoints is activation.Endpoints.UNKNOWN:
            assert result.action in (None, activation.Action.SCALE_UP)


def test_rules_hold_only_while_waking() -> None:
    assert [p for p in activation.Phase if activation.holds_rules(activation.ActivationStatus(phase=p))] == [
        activation.Phase.WAKING
    ]


@pytest.mark.parametrize(
    ("cold_start", "expected"),
    [(None, 60), (0.2, 1), (89.1, 90), (120.0, 120), (10_000.0, 3600)],
)
def test_retry_after_is_the_last_cold_start(cold_start: float | None, expected: int) -> None:
    assert activation.retry_after(cold_start) == expected


def test_a_wake_is_pending_until_awoken() -> None:
    assert not activation.ActivationStatus().wake_pending
    assert activation.ActivationStatus(wake_requested_at=5.0).wake_pending
    assert not activation.ActivationStatus(wake_requested_at=5.0, awoken_at=5.0).wake_pending
    assert activation.ActivationStatus(wake_requested_at=6.0, awoken_at=5.0).wake_pending
