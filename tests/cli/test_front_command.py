"""``drain-router front`` only translates: flags and DRAIN_ROUTER_FRONT_* variables -> the router's
Config and FrontSettings -> process.serve; bad values exit 2 naming the flag and the remedy."""

from __future__ import annotations

from typing import Any

import pytest
from click.testing import CliRunner

from drain_router import cli, config, early_signals
from drain_router.decisions.continuation import Dialect
from drain_router.front import process
from drain_router.front.settings import FrontSettings

PODS = ["--pods", "http://10.0.0.1:8080,http://10.0.0.2:8080"]


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> list[tuple[config.Config, FrontSettings]]:
    seen: list[tuple[config.Config, FrontSettings]] = []

    def fake_serve(cfg: config.Config, settings: FrontSettings, **kwargs: Any) -> int:
        seen.append((cfg, settings))
        return 0

    monkeypatch.setattr(process, "serve", fake_serve)
    monkeypatch.setattr(early_signals, "install", lambda: None)
    monkeypatch.setattr("drain_router.logs.configure", lambda **kw: None)
    return seen


def run(args: list[str], env: dict[str, str] | None = None) -> Any:
    return CliRunner().invoke(cli.main, ["front", *args], env=env, catch_exceptions=False)


def test_the_defaults(served) -> None:
    assert run(PODS).exit_code == 0
    [(cfg, settings)] = served
    assert settings.pod_urls() == ["http://10.0.0.1:8080", "http://10.0.0.2:8080"]
    assert (settings.dialect, settings.max_continuations, settings.poll_interval_secs) == (Dialect.COMPLETIONS, 3, 1)
    assert (cfg.proxy.port, cfg.admin.port, cfg.drain.shutdown_drain_secs) == (8080, 9091, 30)


def test_flags_and_their_variables(served) -> None:
    env = {"DRAIN_ROUTER_FRONT_SERVICE": "team-a/llama", "DRAIN_ROUTER_FRONT_MAX_CONTINUATIONS": "5"}
    assert run(["--continuation", "token-ids", "--queue-timeout-secs", "0.5"], env=env).exit_code == 0
    [(cfg, settings)] = served
    assert settings.service_ref() == ("team-a", "llama")
    assert (settings.dialect, settings.max_continuations) == (Dialect.TOKEN_IDS, 5)
    assert float(cfg.admission.queue_timeout_secs) == 0.5


@pytest.mark.parametrize(
    ("args", "words"),
    [
        ([], "exactly one of --service"),
        ([*PODS, "--service", "a/b"], "exactly one of --service"),
        (["--service", "llama"], "expected NAMESPACE/NAME"),
        (["--service", "a/b/c"], "expected NAMESPACE/NAME"),
        (["--pods", "10.0.0.1:8080"], "'--pods'"),
        ([*PODS, "--continuation", "tokens"], "'--continuation'"),
        ([*PODS, "--max-continuations", "-1"], "'--max-continuations'"),
        ([*PODS, "--poll-interval-secs", "0"], "'--poll-interval-secs'"),
        ([*PODS, "--port", "9091"], "--admin-port"),
    ],
)
def test_bad_values_exit_2_naming_the_flag(served, args: list[str], words: str) -> None:
    result = CliRunner().invoke(cli.main, ["front", *args])
    assert result.exit_code == 2, result.output
    assert words in result.output
    assert not served


def test_help_explains_the_flags() -> None:
    out = run(["--help"]).output
    for words in ("--service NAMESPACE/NAME", "--pods URL[,URL...]", "--continuation", "Continuing cut streams"):
        assert words in out
