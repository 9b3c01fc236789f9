"""``activation.step``, ``holds_rules``, ``wake_replicas`` and ``retry_after`` from
``tests/cases/activation/``: the orderings of a sleep and a wake, one pass per row."""

from __future__ import annotations

import enum
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


AWOKEN = 100.0
"""The last wake's ``awokenAt`` (seconds after T0) in :func:`test_a_late_wake_request`'s table."""
_OLDER, _EQUAL, _NEWER = 60.0, AWOKEN, 130.0
"""``wakeRequestedAt`` against ``awokenAt``: the wake's own request, one stamped at the same
second, and one that landed after the wake (a second activator replica's last poll)."""
_ASLEEP = activation.Observed(endpoints=activation.Endpoints.ACTIVATOR, replicas=0, router_ready=False, listening=True)
_AWAKE = activation.Observed(endpoints=activation.Endpoints.NONE, replicas=2, router_ready=True, listening=True)
_STARTING = activation.Observed(
    endpoints=activation.Endpoints.ACTIVATOR, replicas=2, router_ready=False, listening=True
)
_SLEEPING = activation.Observed(endpoints=activation.Endpoints.ACTIVATOR, replicas=2, router_ready=True, listening=True)
"""Active, the activator's endpoints added, the Deployment not yet at 0 (a sleep under way)."""
P = activation.Phase
A = activation.Action


@pytest.mark.parametrize(
    ("phase", "observed", "sleep_due", "requested", "action", "then"),
    [
        # Active, awake, no sleep due: whatever the request's time, nothing (a late one stays on record).
        (P.ACTIVE, _AWAKE, False, _OLDER, None, P.ACTIVE),
        (P.ACTIVE, _AWAKE, False, _EQUAL, None, P.ACTIVE),
        (P.ACTIVE, _AWAKE, False, _NEWER, None, P.ACTIVE),
        # Active, a sleep due: a late request is forgotten before the activator becomes an endpoint.
        (P.ACTIVE, _AWAKE, True, _NEWER, A.ADD_ACTIVATOR, P.ACTIVE),
        # Active, the activator already an endpoint (a sleep under way): a newer request is a held
        # request, and cancels the sleep (the pods never stopped); an answered one does not.
        (P.ACTIVE, _SLEEPING, True, _OLDER, A.SCALE_TO_ZERO, P.SCALED_TO_ZERO),
        (P.ACTIVE, _SLEEPING, True, _EQUAL, A.SCALE_TO_ZERO, P.SCALED_TO_ZERO),
        (P.ACTIVE, _SLEEPING, True, _NEWER, A.REMOVE_ACTIVATOR, P.ACTIVE),
        # Asleep: only a request newer than the last wake wakes it (the one second wake there is).
        (P.SCALED_TO_ZERO, _ASLEEP, False, _OLDER, None, P.SCALED_TO_ZERO),
        (P.SCALED_TO_ZERO, _ASLEEP, False, _EQUAL, None, P.SCALED_TO_ZERO),
        (P.SCALED_TO_ZERO, _ASLEEP, False, _NEWER, A.SCALE_UP, P.WAKING),
        # Waking: the scale-up is done; another request changes nothing.
        (P.WAKING, _STARTING, False, _OLDER, None, P.WAKING),
        (P.WAKING, _STARTING, False, _EQUAL, None, P.WAKING),
        (P.WAKING, _STARTING, False, _NEWER, None, P.WAKING),
    ],
    ids=lambda v: v.name.lower() if isinstance(v, enum.Enum) else None,
)
def test_a_late_wake_request(
    phase: activation.Phase,
    observed: activation.Observed,
    sleep_due: bool,
    requested: float,
    action: activation.Action | None,
    then: activation.Phase,
) -> None:
    """A ``wakeRequestedAt`` older than, equal to or newer than ``awokenAt``, in each phase: a wake
    (SCALE_UP) only for a newer request while ScaledToZero; ``awokenAt`` and the cold start move
    only on a wake's end (here: never, or at the cancelled sleep)."""
    status = activation.ActivationStatus(
        phase=phase,
        replicas_before_zero=2,
        wake_requested_at=T0 + requested,
        awoken_at=T0 + AWOKEN,
        cold_start_seconds=7.0,
    )
    now = T0 + 150
    result = activation.step(observed, status, sleep_due=sleep_due, now=now, activation_timeout=300)
    assert (result.action, result.status.phase) == (action, then)
    assert result.status.cold_start_seconds == 7.0
    cancelled_sleep = action is A.REMOVE_ACTIVATOR
    assert result.status.awoken_at == (now if cancelled_sleep else T0 + AWOKEN)
    woken = [e.reason for e in result.events]
    assert woken == (["WakeRequested"] if action is A.SCALE_UP else [])
