"""How a realtime session ended (a table in tests/cases/sessions/), and the event tally."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from drain_router_dev import sessions

CASES = yaml.safe_load((Path(__file__).parent.parent / "cases" / "sessions" / "classify.yaml").read_text())


@pytest.mark.parametrize("case", [pytest.param(c, id=c["id"]) for c in CASES])
def test_classify(case: dict[str, Any]) -> None:
    result = sessions.SessionResult(
        handshake_status=case["handshake_status"],
        close_code=case.get("close_code"),
        client_closed=case.get("client_closed", False),
        error=case.get("error"),
        problem=case.get("problem"),
    )
    end = sessions.classify(result)
    assert end is sessions.End(case["expect"])
    assert end.clean == (case["expect"] in ("normal", "going_away"))
    assert end.reconnect == (case["expect"] == "going_away")


def test_every_end_has_a_case() -> None:
    assert {c["expect"] for c in CASES} == {e.value for e in sessions.End}


def _created(server: int = 7) -> dict[str, Any]:
    return {"type": "session.created", "server": server}


def _response(total: int, seqs: list[int] | None = None, *, done: bool = True) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = [{"type": "response.created"}]
    events += [{"type": "response.text.delta", "seq": s, "total": total} for s in (seqs or list(range(total)))]
    return [*events, {"type": "response.done"}] if done else events


def _tally(events: list[dict[str, Any]]) -> sessions.Tally:
    tally = sessions.Tally()
    for event in events:
        tally.feed(event)
    return tally


def test_tally_whole_responses() -> None:
    tally = _tally([_created(42), *_response(3), *_response(0), *_response(2)])
    assert (tally.problem, tally.server, tally.responses, tally.deltas, tally.responding) == (None, 42, 3, 5, False)


def test_tally_a_response_cut_by_the_end_is_no_problem() -> None:
    tally = _tally([_created(), *_response(5, [0, 1], done=False)])
    assert (tally.problem, tally.responses, tally.responding) == (None, 0, True)


@pytest.mark.parametrize(
    ("events", "problem"),
    [
        pytest.param(_response(1), "first event 'response.created', not session.created", id="no-session-created"),
        pytest.param([_created(), _created()], "a second session.created", id="two-session-created"),
        pytest.param([_created(), *_response(3, [0, 2])], "delta 2 where 1 was due", id="missing-delta"),
        pytest.param([_created(), *_response(3, [0, 0, 1, 2])], "delta 0 where 1 was due", id="repeated-delta"),
        pytest.param([_created(), *_response(3, [0, 1])], "response.done after 2 of 3 deltas", id="done-too-early"),
        pytest.param([_created(), *_response(1, [0, 1])], "delta 1 of 1", id="past-total"),
        pytest.param(
            [_created(), {"type": "response.text.delta", "seq": 0, "total": 1}],
            "a delta outside a response",
            id="stray",
        ),
        pytest.param([_created(), {"type": "response.done"}], "response.done outside a response", id="stray-done"),
        pytest.param(
            [_created(), {"type": "response.created"}, {"type": "response.text.delta", "seq": "0", "total": 1}],
            "a delta without an integer seq and total",
            id="seq-not-int",
        ),
        pytest.param(
            [_created(), {"type": "error", "error": {"code": "unknown_event"}}],
            "error event: unknown_event",
            id="error",
        ),
        pytest.param([_created(), {"type": "conversation.item.created"}], "unexpected event", id="unexpected"),
    ],
)
def test_tally_problems(events: list[dict[str, Any]], problem: str) -> None:
    tally = _tally(events)
    assert tally.problem is not None and tally.problem.startswith(problem), tally.problem
