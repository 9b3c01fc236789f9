"""sgl-router PR #39015's advisory cases, as a table (tests/cases/advisory/shutdown-drain.yaml)."""

from __future__ import annotations

from typing import Any

import pytest

from drain_router import config
from drain_router.decisions import advisory
from tests import casefiles

CASES = casefiles.load("advisory/shutdown-drain.yaml")


@pytest.mark.parametrize("case", casefiles.params(CASES["drain_consumes_grace"]))
def test_drain_consumes_grace(case: dict[str, Any]) -> None:
    found = advisory.drain_consumes_grace(case["drain"], case["grace"])
    if not case["warns"]:
        assert found is None
        return
    assert found is not None
    assert found.code is advisory.Code.DRAIN_CONSUMES_GRACE
    assert dict(found.fields) == {
        "shutdown_drain_secs": case["drain"],
        "termination_grace_secs": case["compared_grace"],
        "grace_declared": case["grace_declared"],
    }


@pytest.mark.parametrize("case", casefiles.params(CASES["drain_shorter_than_probe_window"]))
def test_drain_shorter_than_probe_window(case: dict[str, Any]) -> None:
    found = advisory.drain_shorter_than_probe_window(case["drain"], case["period"], case["threshold"])
    if not case["warns"]:
        assert found is None
        return
    assert found is not None
    assert found.code is advisory.Code.DRAIN_SHORTER_THAN_PROBE_WINDOW
    assert dict(found.fields)["probe_window_secs"] == case["window"]
    assert dict(found.fields)["shutdown_drain_secs"] == case["drain"]


def test_message_is_static_and_numbers_are_fields() -> None:
    a = advisory.drain_consumes_grace(60, 60)
    b = advisory.drain_consumes_grace(1800, None)
    assert a is not None and b is not None
    assert a.message == b.message, "one static message per code, so aggregators can group"
    assert "60" not in a.message and "1800" not in b.message
    assert a.as_dict()["code"] == "DRAIN_CONSUMES_GRACE"


def test_default_grace_constant_is_one_value() -> None:
    assert advisory.K8S_DEFAULT_GRACE_SECS == config.K8S_DEFAULT_GRACE_SECS == 30


def test_all_advisories_in_stable_order() -> None:
    found = advisory.advisories(
        shutdown_drain_secs=30, termination_grace_secs=None, probe_period_secs=10, probe_failure_threshold=3
    )
    assert [a.code.value for a in found] == ["DRAIN_CONSUMES_GRACE", "DRAIN_SHORTER_THAN_PROBE_WINDOW"]
    assert (
        advisory.advisories(
            shutdown_drain_secs=31, termination_grace_secs=60, probe_period_secs=10, probe_failure_threshold=3
        )
        == ()
    )
