"""The admission flags: their defaults, the flags and their DRAIN_ROUTER_* variables reach the
config, and bad values are refused naming the flag."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from drain_router import cli, config


def test_defaults_leave_admission_off() -> None:
    cfg = config.build_config(upstream="http://127.0.0.1:8000")
    assert (cfg.admission.max_concurrent_requests, cfg.admission.queue_size, cfg.admission.queue_timeout_secs) == (
        0,
        256,
        30,
    )
    assert config.effective(cfg)["config"]["admission"] == {
        "max_concurrent_requests": 0,
        "queue_size": 256,
        "queue_timeout_secs": 30,
        "exempt_paths": ("/health", "/v1/models"),
    }
    assert config.AdmissionSettings().queue_timeout_secs == 30, "a Config built by hand: the default drain's"


@pytest.mark.parametrize(
    ("drain", "timeout"),
    [(0, 60), (1, 1), (17, 17), (30, 30), (60, 60), (61, 60), (120, 60), (1800, 60)],
)
def test_the_default_timeout_is_the_drain_at_most_a_minute(drain: int, timeout: int) -> None:
    """Not given, the queue timeout follows the drain given (no window: the minute), from the
    library and from the command line alike; given, it is what was given."""
    cfg = config.build_config(upstream="http://127.0.0.1:8000", shutdown_drain_secs=drain)
    assert cfg.admission.queue_timeout_secs == timeout
    args = ["check", "--upstream", "http://127.0.0.1:8000", "--shutdown-drain-secs", str(drain)]
    result = CliRunner().invoke(cli.main, args, env={}, catch_exceptions=False)
    assert json.loads(result.output)["config"]["admission"]["queue_timeout_secs"] == timeout
    given = config.build_config(upstream="http://127.0.0.1:8000", shutdown_drain_secs=drain, queue_timeout_secs="45")
    assert given.admission.queue_timeout_secs == 45


@pytest.mark.parametrize(
    ("value", "seconds"),
    [("1.5", 1.5), ("0.25", 0.25), (".5", 0.5), ("2.", 2), ("30", 30), ("30.0", 30), (0.3, 0.3), (7, 7)],
)
def test_fractions_are_taken(value: object, seconds: float) -> None:
    cfg = config.build_config(upstream="http://127.0.0.1:8000", queue_timeout_secs=value)
    assert cfg.admission.queue_timeout_secs == seconds
    assert type(cfg.admission.queue_timeout_secs) is type(seconds), "whole seconds stay whole (30, not 30.0)"


def test_flags_and_variables_reach_the_config(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[config.Config] = []
    monkeypatch.setattr("drain_router.runtime.lifecycle.serve", lambda cfg, **kw: seen.append(cfg) or 0)
    monkeypatch.setattr("drain_router.early_signals.install", lambda: None)
    monkeypatch.setattr("drain_router.logs.configure", lambda **kw: None)
    env = {"DRAIN_ROUTER_QUEUE_SIZE": "12", "DRAIN_ROUTER_QUEUE_TIMEOUT_SECS": "0.75"}
    args = ["serve", "--upstream", "http://127.0.0.1:8000", "--max-concurrent-requests", "8"]
    result = CliRunner().invoke(cli.main, args, env=env, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert (seen[0].admission.max_concurrent_requests, seen[0].admission.queue_size) == (8, 12)
    assert seen[0].admission.queue_timeout_secs == 0.75


@pytest.mark.parametrize(
    ("key", "value", "named"),
    [
        pytest.param("max_concurrent_requests", "-1", "--max-concurrent-requests", id="negative-limit"),
        pytest.param("queue_size", "many", "--queue-size", id="word-size"),
        pytest.param("queue_timeout_secs", "0", "--queue-timeout-secs", id="zero-timeout"),
        pytest.param("queue_timeout_secs", "-0.5", "--queue-timeout-secs", id="negative-fraction"),
        pytest.param("queue_timeout_secs", "nan", "--queue-timeout-secs", id="nan-timeout"),
        pytest.param("queue_timeout_secs", float("inf"), "--queue-timeout-secs", id="infinite-timeout"),
        pytest.param("queue_timeout_secs", float("nan"), "--queue-timeout-secs", id="nan-float-timeout"),
        pytest.param("queue_timeout_secs", True, "--queue-timeout-secs", id="bool-timeout"),
    ],
)
def test_bad_values_name_the_flag(key: str, value: object, named: str) -> None:
    with pytest.raises(config.ConfigError) as caught:
        config.build_config(upstream="http://127.0.0.1:8000", **{key: value})
    assert str(caught.value).startswith(named + "=")
