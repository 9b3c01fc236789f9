"""The model server's health verdict and the UPSTREAM_HEALTH_SLOWER_THAN_DRAIN advisory, as tables
(tests/cases/health/verdicts.yaml, tests/cases/advisory/upstream-health.yaml)."""

from __future__ import annotations

from typing import Any

import pytest

from drain_router import config
from drain_router.decisions import advisory, health
from tests import casefiles

VERDICTS = casefiles.load("health/verdicts.yaml")
ADVISORY = casefiles.load("advisory/upstream-health.yaml")


@pytest.mark.parametrize("case", casefiles.params(VERDICTS["verdicts"]))
def test_verdict_after_each_poll(case: dict[str, Any]) -> None:
    verdict = health.Verdict()
    seen = []
    for answer in case["polls"]:
        verdict = health.judge(verdict, answer == "ok", case["threshold"])
        seen.append(verdict.up)
    assert seen == case["up"]


@pytest.mark.parametrize("case", casefiles.params(VERDICTS["next_poll_in"]))
def test_polls_keep_a_fixed_cadence(case: dict[str, Any]) -> None:
    assert health.next_poll_in(case["interval"], case["elapsed"]) == pytest.approx(case["wait"])


@pytest.mark.parametrize("case", casefiles.params(ADVISORY["notice_secs"]))
def test_notice_secs(case: dict[str, Any]) -> None:
    assert health.notice_secs(case["interval"], case["threshold"], case["timeout"]) == case["notice"]


@pytest.mark.parametrize("case", casefiles.params(ADVISORY["upstream_health_slower_than_drain"]))
def test_upstream_health_slower_than_drain(case: dict[str, Any]) -> None:
    polling = (
        advisory.HealthPolling(
            interval_secs=case["interval"], failure_threshold=case["threshold"], timeout_secs=case["timeout"]
        )
        if case["path"]
        else None
    )
    found = advisory.upstream_health_slower_than_drain(case["drain"], polling)
    if not case["warns"]:
        assert found is None
        return
    assert found is not None
    assert found.code is advisory.Code.UPSTREAM_HEALTH_SLOWER_THAN_DRAIN
    assert dict(found.fields) == {
        "shutdown_drain_secs": case["drain"],
        "upstream_health_interval_secs": case["interval"],
        "upstream_health_failure_threshold": case["threshold"],
        "upstream_health_timeout_secs": case["timeout"],
        "upstream_health_notice_secs": case["notice"],
    }
    assert str(case["notice"]) not in found.message, "a static message; the numbers are fields"


def test_config_feeds_the_advisory_only_with_a_health_path() -> None:
    slow = {"upstream_health_interval_secs": 10, "termination_grace_secs": 120}
    assert not config.advisories(config.build_config(upstream="http://127.0.0.1:8000", **slow))
    cfg = config.build_config(upstream="http://127.0.0.1:8000", upstream_health_path="/health", **slow)
    [found] = config.advisories(cfg)
    assert found.as_dict()["upstream_health_notice_secs"] == 3 * 10 + 2
    assert config.effective(cfg)["advisories"][0]["code"] == "UPSTREAM_HEALTH_SLOWER_THAN_DRAIN"


def test_defaults() -> None:
    cfg = config.build_config(upstream="http://127.0.0.1:8000")
    assert cfg.health.upstream_health_timeout_secs == 2
    assert cfg.health.upstream_health_failure_threshold == 3
