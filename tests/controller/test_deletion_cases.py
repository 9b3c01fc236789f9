"""The 18 staged-deletion cases, one YAML file each, driving the pure ``deletion.next_stage``.

Each file is ``{id, scenario, now, annotations?, spec?, status, observations, expect}``. ``expect.status``
is a subset of ``status.deletion`` as written to the API (RFC 3339 times); ``events`` and ``requeueAt``
are compared exactly when present. ``actions`` is always compared: a case without it asserts that the
decision has none. ``condition`` (``{status, reason}`` of ``Deleting``) is required whenever the
decision writes a status, and must be absent when it writes none.
"""

from __future__ import annotations

from typing import Any

import pytest

from drain_router.controller.kube import observe
from drain_router.decisions import deletion

from . import casefiles

CONTROLLER_CASES = casefiles.load_dir("controller")


def test_there_are_eighteen_cases() -> None:
    assert len(CONTROLLER_CASES) == 18


@pytest.mark.parametrize("case", CONTROLLER_CASES)
def test_controller_case(case: dict[str, Any]) -> None:
    spec = observe.deletion_spec((case.get("spec") or {}).get("deletion"))
    resolution = deletion.resolve_knobs(case.get("annotations") or {}, spec)
    status = None if case["status"] is None else deletion.DeletionStatus.from_dict(case["status"])
    now = casefiles.t(case["now"])
    assert now is not None
    obs = casefiles.observations(case["observations"])

    decision = deletion.next_stage(status, obs, resolution.knobs, now)
    again = deletion.next_stage(status, obs, resolution.knobs, now)

    expect = case["expect"]
    assert decision == again, "next_stage must be a pure function of its inputs"
    assert decision.verdict.value == expect["verdict"]
    if "invalid" in expect:
        got = [{"reason": i.event_reason.value, "key": i.key} for i in resolution.invalid]
        assert got == expect["invalid"]
    else:
        assert resolution.invalid == ()
    if "status" in expect:
        if expect["status"] is None:
            assert decision.status is None
        else:
            assert decision.status is not None
            written = decision.status.as_dict()
            assert {k: written[k] for k in expect["status"]} == expect["status"]
    assert [casefiles.action_dict(a) for a in decision.actions] == expect.get("actions", [])
    if decision.condition is None:
        assert "condition" not in expect, "no status is written, so no condition"
    else:
        assert "condition" in expect, f"the case must state the condition: {decision.condition}"
        got = {"status": decision.condition.status, "reason": decision.condition.reason.value}
        assert decision.condition.type == "Deleting" and got == expect["condition"]
    if "events" in expect:
        got_events = [{"type": e.type, "reason": e.reason.value, "message": e.message} for e in decision.events]
        wanted = expect["events"]
        assert [{k: g[k] for k in w} for g, w in zip(got_events, wanted)] == wanted
        assert len(got_events) == len(wanted), got_events
    if "requeueAt" in expect:
        assert decision.requeue_at == casefiles.t(expect["requeueAt"])
    # Invariants of every case: the status never goes backwards, and never mentions a stage it skipped.
    if status is not None and status.stage is not None and decision.status is not None:
        order = list(deletion.Stage)
        assert decision.status.stage is not None
        assert order.index(decision.status.stage) >= order.index(status.stage)
    if decision.status is not None and decision.status.stage is not None:
        assert decision.status.started_at is not None
        assert decision.status.deadline == decision.status.started_at + resolution.knobs.max_wait
