"""The reconciliation of the three views (clients, routers, model servers), driven by a table.

No processes here: ``e2e/reconcile.py`` is pure, and ``cases/reconcile.yaml`` holds one scenario's
views per case with what the reconciliation must find.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e import reconcile

CASES = yaml.safe_load((Path(__file__).parent / "cases" / "reconcile.yaml").read_text())


@pytest.mark.parametrize("case", [pytest.param(c, id=c["id"]) for c in CASES])
def test_reconcile(case: dict[str, Any]) -> None:
    result = reconcile.reconcile(
        reconcile.ClientView(**case["clients"]),
        reconcile.RouterView(**case["routers"]),
        reconcile.ModelView(**case["models"]),
    )
    expect = case["expect"]
    assert result.unaccounted == expect["unaccounted"], result
    assert result.explained == expect["explained"], result
    assert len(result.mismatches) == len(expect["mismatches"]), result.mismatches
    for got, want in zip(result.mismatches, expect["mismatches"]):
        assert want in got, result.mismatches
    assert result.clean == (not expect["unaccounted"] and not expect["mismatches"])
