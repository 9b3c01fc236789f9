"""The admission flags: their defaults, the flags and their DRAIN_ROUTER_* variables reach the
config, and bad values are refused naming the flag."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from drain_router import cli, config


def test_defaults_leave_admission_off() -> None:
    cfg = config.build_config(upstream="http://127.0.0.1:8000")
    assert (cfg.admission.max_concurrent_requests, cfg.admission.queue_size, cfg.admission.queue_timeout_secs) == (
        0,
        256,
        60,
    )
    assert config.effective(cfg)["config"]["admission"] == {
        "max_concurrent_requests": 0,
        "queue_size": 256,
        "queue_timeout_secs": 60,
        "exempt_paths": ("/health", "/v1/models"),
    }


def test_flags_and_variables_reach_the_config(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[config.Config] = []
    monkeypatch.setattr("drain_router.runtime.lifecycle.serve", lambda cfg, **kw: seen.append(cfg) or 0)
    monkeypatch.setattr("drain_router.early_signals.install", lambda: None)
    monkeypatch.setattr("drain_router.logs.configure", lambda **kw: None)
    env = {"DRAIN_ROUTER_QUEUE_SIZE": "12", "DRAIN_ROUTER_QUEUE_TIMEOUT_SECS": "20"}
    args = ["serve", "--upstream", "http://127.0.0.1:8000", "--max-concurrent-requests", "8"]
    result = CliRunner().invoke(cli.main, args, env=env, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert (seen[0].admission.max_concurrent_requests, seen[0].admission.queue_size) == (8, 12)
    assert seen[0].admission.queue_timeout_secs == 20


@pytest.mark.parametrize(
    ("key", "value", "named"),
    [
        pytest.param("max_concurrent_requests", "-1", "--max-concurrent-requests", id="negative-limit"),
        pytest.param("queue_size", "many", "--queue-size", id="word-size"),
        pytest.param("queue_timeout_secs", "0", "--queue-timeout-secs", id="zero-timeout"),
        pytest.param("queue_timeout_secs", "1.5", "--queue-timeout-secs", id="fractional-timeout"),
    ],
)
def test_bad_values_name_the_flag(key: str, value: str, named: str) -> None:
    with pytest.raises(config.ConfigError) as caught:
        config.build_config(upstream="http://127.0.0.1:8000", **{key: value})
    assert str(caught.value).startswith(named + "=")
