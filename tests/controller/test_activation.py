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
            route=activation.Route(observed["route"]), replicas=observed["replicas"], router_ready=observed["ready"]
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
    ("route", "ready", "replicas"),
    [(r, ready, n) for r in activation.Route for ready in (False, True) for n in (0, 1, 3)],
)
@pytest.mark.parametrize("phase", list(activation.Phase))
@pytest.mark.parametrize("sleep_due", [False, True])
def test_the_route_goes_to_the_service_only_when_a_router_answered_ready(
    route: activation.Route, ready: bool, replicas: int, phase: activation.Phase, sleep_due: bool
) -> None:
    """Over every observation: a switch back to the model Service is only ever decided on a pass that
    saw a router answer ready, and a scale-down only with the route away from the model Service."""
    for wake in (None, T0 - 10):
        status = activation.ActivationStatus(phase=phase, replicas_before_zero=3, wake_requested_at=wake)
        observed = activation.Observed(route=route, replicas=replicas, router_ready=ready)
        result = activation.step(observed, status, sleep_due=sleep_due, now=T0, activation_timeout=300)
        if result.action is activation.Action.ROUTE_TO_SERVICE:
            assert ready and replicas > 0
        if result.action is activation.Action.SCALE_TO_ZERO:
            assert route in (activation.Route.ACTIVATOR, activation.Route.NONE)
        if result.action is activation.Action.SCALE_UP:
            assert result.replicas is not None and result.replicas >= 1


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
