"""``lifecycle.validate``, ``lifecycle.idle_clock``, ``lifecycle.next_rule`` and ``lifecycle.done_from``
from ``tests/cases/lifecycle/``."""

from __future__ import annotations

from typing import Any

import pytest

from drain_router.decisions import durations, lifecycle
from tests import casefiles

T0 = durations.parse_time("2025-01-01T00:00:00Z")
DEFAULT_RULES = [
    {"policy": "ScaleToZero", "idleSeconds": 100},
    {"policy": "DeleteWorkload", "idleSeconds": 1000},
    {"policy": "DeleteSelf", "idleSeconds": 5000},
]


def _t(value: float | None) -> float | None:
    return None if value is None else T0 + value


def _status(data: dict[str, Any] | None) -> lifecycle.LifecycleStatus:
    data = data or {}
    return lifecycle.LifecycleStatus(
        idle_since=_t(data.get("idleSince")), scaled_to_zero_at=_t(data.get("scaledToZeroAt"))
    )


@pytest.mark.parametrize("row", casefiles.params(casefiles.load("lifecycle/validate.yaml")))
def test_validate(row: dict[str, Any]) -> None:
    errors = lifecycle.validate(row["rules"])
    assert [e.field for e in errors] == row["errors"]
    if errors:
        with pytest.raises(ValueError, match=r"spec\.lifecycle\.rules"):
            lifecycle.parse(row["rules"])
    else:
        assert {r.policy.value for r in lifecycle.parse(row["rules"])} == {r["policy"] for r in row["rules"]}


@pytest.mark.parametrize("row", casefiles.params(casefiles.load("lifecycle/idle-clock.yaml")))
def test_idle_clock(row: dict[str, Any]) -> None:
    reports: list[lifecycle.RouterReport | lifecycle.ProbeFailure] = [
        lifecycle.ProbeFailure(pod=r["pod"], error=r["error"])
        if "error" in r
        else lifecycle.RouterReport(
            pod=r["pod"],
            inflight=r["inflight"],
            queued=r.get("queued", 0),
            idle_since=_t(r["idleSince"]),
            served=r["served"],
        )
        for r in row["reports"]
    ]
    clock = lifecycle.idle_clock(
        reports, row["replicas"], _status(row["status"]), T0 + row["now"], waking=row.get("waking", False)
    )
    expect = row["expect"]
    assert clock == lifecycle.IdleClock(
        idle_since=_t(expect["idleSince"]), known=expect.get("known", True), woke=expect.get("woke", False)
    )


@pytest.mark.parametrize("row", casefiles.params(casefiles.load("lifecycle/next-rule.yaml")))
def test_next_rule(row: dict[str, Any]) -> None:
    rules = tuple(
        lifecycle.Rule(policy=lifecycle.Policy(r["policy"]), idle_seconds=r["idleSeconds"])
        for r in row.get("rules", DEFAULT_RULES)
    )
    c = row["clock"]
    clock = lifecycle.IdleClock(idle_since=_t(c["idleSince"]), known=c.get("known", True), woke=c.get("woke", False))
    done = {lifecycle.Policy(p): True for p in row.get("done", ())}
    now = T0 + row["now"]
    decision = lifecycle.next_rule(rules, clock, done, _status(row.get("status")), now)
    assert decision == lifecycle.next_rule(rules, clock, done, _status(row.get("status")), now), "pure"
    expect = row["expect"]
    assert (decision.action and decision.action.value) == expect["action"]
    if "events" in expect:
        assert [e.reason.value for e in decision.events] == expect["events"]
    if "requeueAt" in expect:
        assert decision.requeue_at == _t(expect["requeueAt"])
    if "status" in expect:
        assert decision.status == _status(expect["status"])


@pytest.mark.parametrize(
    ("exists", "deleting", "replicas", "stage", "done"),
    [
        (True, False, 2, None, set()),
        (True, False, 0, None, {"ScaleToZero"}),
        (True, True, 2, None, {"ScaleToZero"}),
        (False, False, None, None, {"ScaleToZero"}),
        (False, False, None, "PodsTerminating", {"ScaleToZero"}),
        (False, False, None, "Released", {"ScaleToZero", "DeleteWorkload"}),
    ],
)
def test_done_from_real_state(
    exists: bool, deleting: bool, replicas: int | None, stage: str | None, done: set[str]
) -> None:
    got = lifecycle.done_from(
        deployment_exists=exists, deployment_deleting=deleting, deployment_replicas=replicas, deletion_stage=stage
    )
    assert {p.value for p, yes in got.items() if yes} == done
