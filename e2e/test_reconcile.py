"""The reconciliation of the three views (clients, routers, model servers), driven by tables.

No processes here: ``e2e/reconcile.py`` is pure. ``cases/reconcile.yaml`` holds one scenario's
views per case (realtime sessions among them) with what the reconciliation must find;
``cases/sessions.yaml`` the sessions' ends and fault windows with how :func:`reconcile.session_view`
must count and explain them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e import reconcile

CASES = yaml.safe_load((Path(__file__).parent / "cases" / "reconcile.yaml").read_text())
SESSION_CASES = yaml.safe_load((Path(__file__).parent / "cases" / "sessions.yaml").read_text())


@pytest.mark.parametrize("case", [pytest.param(c, id=c["id"]) for c in CASES])
def test_reconcile(case: dict[str, Any]) -> None:
    sessions = reconcile.SessionView(**case["sessions"]) if "sessions" in case else None
    result = reconcile.reconcile(
        reconcile.ClientView(**case["clients"]),
        reconcile.RouterView(**case["routers"]),
        reconcile.ModelView(**case["models"]),
        sessions,
    )
    expect = case["expect"]
    assert result.unaccounted == expect["unaccounted"], result
    assert result.sessions.unexplained == expect.get("sessions_unexplained", 0), result
    assert result.explained == expect["explained"], result
    assert len(result.mismatches) == len(expect["mismatches"]), result.mismatches
    for got, want in zip(result.mismatches, expect["mismatches"]):
        assert want in got, result.mismatches
    clean = not expect["unaccounted"] and not expect.get("sessions_unexplained") and not expect["mismatches"]
    assert result.clean == clean


@pytest.mark.parametrize("case", [pytest.param(c, id=c["id"]) for c in SESSION_CASES])
def test_session_view(case: dict[str, Any]) -> None:
    view = reconcile.session_view(
        [reconcile.SessionEnd(**{**e, "end": str(e["end"])}) for e in case["ends"]],
        [reconcile.FaultWindow(**w) for w in case["windows"]],
    )
    assert view == reconcile.SessionView(**case["expect"])
