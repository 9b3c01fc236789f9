"""build_config: the one place raw values become a validated Config."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from drain_router import config
from tests import casefiles

UPSTREAMS = casefiles.load("upstreams.yaml")


@pytest.mark.parametrize("case", casefiles.params(UPSTREAMS["accepted"]))
def test_upstream_accepted(case: dict[str, Any]) -> None:
    up = config.parse_upstream(case["value"])
    assert (up.base_url, up.port, up.unix_path) == (case["base_url"], case["port"], case["unix_path"])


@pytest.mark.parametrize("case", casefiles.params(UPSTREAMS["refused"]))
def test_upstream_refused(case: dict[str, Any]) -> None:
    with pytest.raises(config.ConfigError) as err:
        config.parse_upstream(case["value"])
    assert err.value.field == "upstream"
    assert case["says"] in err.value.reason


@pytest.mark.parametrize("secs", [0, 17, 1800, "0", "17", "1800"])
def test_shutdown_drain_passes_through_unchanged(secs: object) -> None:
    cfg = config.build_config(upstream="http://127.0.0.1:8000", shutdown_drain_secs=secs)
    assert cfg.drain.shutdown_drain_secs == int(str(secs))
    assert cfg.drain.shutdown_drain_secs == int(str(secs))


def test_ceiling_itself_starts_and_one_more_is_refused() -> None:
    assert config.build_config(upstream="http://h:1", shutdown_drain_secs=1800).drain.shutdown_drain_secs == 1800
    with pytest.raises(config.ConfigError) as err:
        config.build_config(upstream="http://h:1", shutdown_drain_secs=1801)
    assert err.value.field == "shutdown_drain_secs"
    assert str(config.MAX_SHUTDOWN_DRAIN_SECS) in err.value.reason


def test_deadline_is_grace_minus_margin() -> None:
    cfg = config.build_config(upstream="http://h:1", termination_grace_secs=120)
    assert cfg.drain.deadline_secs() == 120 - config.SHUTDOWN_DEADLINE_MARGIN_SECS
    assert config.build_config(upstream="http://h:1").drain.deadline_secs() is None
    assert config.build_config(upstream="http://h:1", termination_grace_secs=1).drain.deadline_secs() == 0


def test_grace_is_optional_and_maps() -> None:
    assert config.build_config(upstream="http://h:1").drain.termination_grace_secs is None
    assert config.build_config(upstream="http://h:1", termination_grace_secs="600").drain.termination_grace_secs == 600


def test_drain_wait_timeout_defaults_to_grace_else_30() -> None:
    assert config.build_config(upstream="http://h:1").drain.drain_wait_timeout_secs() == 30
    assert config.build_config(upstream="http://h:1", termination_grace_secs=90).drain.drain_wait_timeout_secs() == 90


def test_config_is_frozen() -> None:
    cfg = config.build_config(upstream="http://h:1")
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.drain.shutdown_drain_secs = 5  # type: ignore[misc]


def test_effective_lists_advisories() -> None:
    eff = config.effective(config.build_config(upstream="http://h:1"))
    assert [a["code"] for a in eff["advisories"]] == ["DRAIN_CONSUMES_GRACE"]
    assert eff["config"]["proxy"]["upstream"] == "http://h:1"
    assert eff["config"]["drain"]["deadline_secs"] is None


@pytest.mark.parametrize("mode", ["deadline", "closing", "idle", "IDLE"])
def test_websocket_close_at_takes_each_mode(mode: str) -> None:
    assert config.build_config(upstream="http://h:1", websocket_close_at=mode).drain.websocket_close_at == mode.lower()


def test_websocket_close_at_defaults_to_idle_and_refuses_others() -> None:
    assert config.build_config(upstream="http://h:1").drain.websocket_close_at == "idle"
    with pytest.raises(config.ConfigError) as err:
        config.build_config(upstream="http://h:1", websocket_close_at="never")
    assert "deadline, closing, idle" in err.value.reason
