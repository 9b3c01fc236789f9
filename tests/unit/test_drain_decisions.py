"""The drain state machine, driven by the table in tests/cases/drain/."""

from __future__ import annotations

from typing import Any

import pytest

from drain_router.decisions import drain
from tests import casefiles

TRANSITIONS = casefiles.load("drain/transitions.yaml")


@pytest.mark.parametrize("case", casefiles.params(TRANSITIONS))
def test_next_stage(case: dict[str, Any]) -> None:
    given = case["state"]
    status = drain.DrainStatus(
        phase=drain.Phase(given["phase"]),
        t0=given.get("t0"),
        sigints=given.get("sigints", 0),
        exit_code=given.get("exit_code"),
    )
    decision = drain.next_stage(
        status,
        drain.Event(case["event"]),
        inflight=case.get("inflight", 0),
        drain_secs=case.get("drain_secs", 30),
        now=case.get("now", 1000.0),
    )
    expect = case["expect"]
    assert decision.status.phase == drain.Phase(expect["phase"])
    if "t0" in expect:
        assert decision.status.t0 == expect["t0"]
    if "sigints" in expect:
        assert decision.status.sigints == expect["sigints"]
    assert decision.status.exit_code == expect.get("exit_code")
    assert [a.value for a in decision.actions] == expect["actions"]
    assert list(decision.events) == expect["events"]
    assert status == drain.DrainStatus(
        phase=drain.Phase(given["phase"]),
        t0=given.get("t0"),
        sigints=given.get("sigints", 0),
        exit_code=given.get("exit_code"),
    ), "next_stage must not mutate its input"


@pytest.mark.parametrize("event", list(drain.Event))
@pytest.mark.parametrize("phase", list(drain.Phase))
def test_phases_only_move_forward(phase: drain.Phase, event: drain.Event) -> None:
    for inflight in (0, 1):
        decision = drain.next_stage(
            drain.DrainStatus(phase=phase, t0=1.0), event, inflight=inflight, drain_secs=1, now=2.0
        )
        assert decision.status.phase.order >= phase.order


@pytest.mark.parametrize("row", casefiles.load("drain/readiness.yaml"), ids=lambda r: f"{r[0]}-{r[1]}")
def test_readiness(row: list[Any]) -> None:
    phase, upstream_up, code, word = row
    assert drain.readiness(drain.Phase(phase), upstream_up) == (code, word)


def test_connection_close_from_draining_on() -> None:
    assert [p.value for p in drain.Phase if drain.closes_connections(p)] == ["draining", "closing", "exited"]


def test_phase_has_no_truth_value() -> None:
    with pytest.raises(NotImplementedError):
        bool(drain.Phase.SERVING)


def test_log_events_carry_their_level_and_the_state_they_announce() -> None:
    warnings = {e.value for e in drain.LogEvent if e.level == "warning"}
    assert warnings == {"drain.deadline", "drain.aborted", "drain.signal_ignored"}
    assert {e.value: e.phase.value for e in drain.LogEvent if e.phase is not None} == {
        "state.serving": "serving",
        "drain.start": "draining",
        "drain.closing": "closing",
        "drain.complete": "exited",
        "drain.deadline": "exited",
        "drain.aborted": "exited",
    }
    assert drain.LogEvent.SIGNAL_IGNORED.phase is None
