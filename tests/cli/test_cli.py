"""The CLI only translates: flags and DRAIN_ROUTER_* variables -> Config -> lifecycle.serve."""

from __future__ import annotations

import json
from typing import Any

import pytest
from click.testing import CliRunner

from drain_router import cli, config, early_signals
from drain_router.runtime import lifecycle
from tests import casefiles

UPSTREAM = ["--upstream", "http://127.0.0.1:8000"]


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> list[config.Config]:
    """Replace the real serve loop (and the early signal capture) with a recorder."""
    seen: list[config.Config] = []

    def fake_serve(cfg: config.Config, **kwargs: Any) -> int:
        seen.append(cfg)
        return 0

    monkeypatch.setattr(lifecycle, "serve", fake_serve)
    monkeypatch.setattr(early_signals, "install", lambda: None)
    monkeypatch.setattr("drain_router.logs.configure", lambda **kw: None)
    return seen


def run(args: list[str], env: dict[str, str] | None = None) -> Any:
    return CliRunner().invoke(cli.main, args, env=env, catch_exceptions=False)


@pytest.mark.parametrize("secs", ["0", "17", "1800"])
def test_shutdown_drain_secs_maps_into_config(served: list[config.Config], secs: str) -> None:
    result = run(["serve", *UPSTREAM, "--shutdown-drain-secs", secs])
    assert result.exit_code == 0, result.output
    assert served[0].drain.shutdown_drain_secs == int(secs)
    assert served[0].drain.shutdown_drain_secs == int(secs)


def test_defaults(served: list[config.Config]) -> None:
    assert run(["serve", *UPSTREAM]).exit_code == 0
    cfg = served[0]
    assert (cfg.proxy.host, cfg.proxy.port, cfg.admin.port) == ("0.0.0.0", 8080, 9091)
    assert cfg.drain.shutdown_drain_secs == 30
    assert cfg.drain.termination_grace_secs is None
    assert cfg.proxy.upstream_max_connections == 0
    assert cfg.proxy.max_request_body_bytes == 100 * 1024 * 1024
    assert (cfg.log.format, cfg.log.level, cfg.log.access_log) == ("json", "info", False)


def test_every_flag_reaches_config(served: list[config.Config]) -> None:
    result = run(
        [
            "serve",
            "--upstream",
            "unix:/run/m.sock",
            "--host",
            "127.0.0.1",
            "--port",
            "8181",
            "--admin-host",
            "127.0.0.2",
            "--admin-port",
            "9191",
            "--shutdown-drain-secs",
            "45",
            "--termination-grace-secs",
            "120",
            "--readiness-probe-period-secs",
            "5",
            "--readiness-probe-failure-threshold",
            "3",
            "--upstream-health-path",
            "/health",
            "--upstream-health-interval-secs",
            "4",
            "--upstream-health-timeout-secs",
            "3",
            "--upstream-health-failure-threshold",
            "5",
            "--upstream-connect-timeout-secs",
            "7",
            "--upstream-max-connections",
            "500",
            "--max-request-body-bytes",
            "1024",
            "--log-format",
            "console",
            "--log-level",
            "DEBUG",
            "--access-log",
        ]
    )
    assert result.exit_code == 0, result.output
    cfg = served[0]
    assert cfg.proxy.upstream.unix_path == "/run/m.sock"
    assert (cfg.proxy.host, cfg.proxy.port, cfg.admin.host, cfg.admin.port) == ("127.0.0.1", 8181, "127.0.0.2", 9191)
    assert (cfg.drain.shutdown_drain_secs, cfg.drain.termination_grace_secs) == (45, 120)
    assert (cfg.drain.readiness_probe_period_secs, cfg.drain.readiness_probe_failure_threshold) == (5, 3)
    assert (cfg.health.upstream_health_path, cfg.health.upstream_health_interval_secs) == ("/health", 4)
    assert (cfg.health.upstream_health_timeout_secs, cfg.health.upstream_health_failure_threshold) == (3, 5)
    assert (cfg.proxy.upstream_connect_timeout_secs, cfg.proxy.upstream_max_connections) == (7, 500)
    assert cfg.proxy.max_request_body_bytes == 1024
    assert (cfg.log.format, cfg.log.level, cfg.log.access_log) == ("console", "debug", True)


def test_environment_variables(served: list[config.Config]) -> None:
    env = {
        "DRAIN_ROUTER_UPSTREAM": "http://10.0.0.1:8000",
        "DRAIN_ROUTER_SHUTDOWN_DRAIN_SECS": "60",
        "DRAIN_ROUTER_TERMINATION_GRACE_SECS": "180",
        "DRAIN_ROUTER_ADMIN_PORT": "9999",
        "DRAIN_ROUTER_ACCESS_LOG": "true",
        "DRAIN_ROUTER_UPSTREAM_HEALTH_TIMEOUT_SECS": "4",
        "DRAIN_ROUTER_UPSTREAM_HEALTH_FAILURE_THRESHOLD": "2",
        "DRAIN_ROUTER_WEBSOCKET_CLOSE_AT": "closing",
    }
    assert run(["serve"], env=env).exit_code == 0
    cfg = served[0]
    assert cfg.drain.websocket_close_at == "closing"
    assert cfg.proxy.upstream.base_url == "http://10.0.0.1:8000"
    assert (cfg.drain.shutdown_drain_secs, cfg.drain.termination_grace_secs, cfg.admin.port) == (60, 180, 9999)
    assert cfg.log.access_log is True
    assert (cfg.health.upstream_health_timeout_secs, cfg.health.upstream_health_failure_threshold) == (4, 2)


@pytest.mark.parametrize("case", casefiles.params(casefiles.load("config_errors.yaml")))
@pytest.mark.parametrize("command", ["serve", "check"])
def test_hard_errors_exit_2_naming_flag_value_remedy(
    served: list[config.Config], command: str, case: dict[str, Any]
) -> None:
    result = CliRunner().invoke(cli.main, [command, *UPSTREAM, *case["args"]])
    assert result.exit_code == 2
    assert case["flag"] in result.output
    assert case["says"] in result.output
    assert served == [], "a refused config never reaches serve"


def test_missing_upstream_is_exit_2(served: list[config.Config]) -> None:
    result = CliRunner().invoke(cli.main, ["serve"])
    assert result.exit_code == 2
    assert "--upstream" in result.output


def test_check_prints_config_and_advisories_exit_0() -> None:
    result = run(["check", *UPSTREAM])
    assert result.exit_code == 0
    data = json.loads(result.output)
    assert data["config"]["drain"]["shutdown_drain_secs"] == 30
    [adv] = data["advisories"]
    assert adv["code"] == "DRAIN_CONSUMES_GRACE"
    assert (adv["shutdown_drain_secs"], adv["termination_grace_secs"], adv["grace_declared"]) == (30, 30, False)


def test_check_silent_with_declared_grace() -> None:
    result = run(["check", *UPSTREAM, "--termination-grace-secs", "120"])
    assert json.loads(result.output)["advisories"] == []


PROBE_15 = ["--readiness-probe-period-secs", "5", "--readiness-probe-failure-threshold", "3"]


@pytest.mark.parametrize(
    ("args", "env", "advised", "code"),
    [
        pytest.param([], {}, True, 0, id="advisory-without-strict-exits-0"),
        pytest.param(["--strict"], {}, True, 1, id="advisory-with-strict-exits-1"),
        pytest.param([], {"DRAIN_ROUTER_STRICT": "1"}, True, 1, id="strict-from-its-variable"),
        pytest.param(["--strict", "--termination-grace-secs", "120"], {}, False, 0, id="silent-exits-0"),
        pytest.param(
            ["--strict", "--shutdown-drain-secs", "60", "--termination-grace-secs", "30"], {}, True, 1, id="over-grace"
        ),
        pytest.param(
            ["--strict", "--termination-grace-secs", "120", "--shutdown-drain-secs", "15", *PROBE_15],
            {},
            True,
            1,
            id="drain-inside-probe-window",
        ),
    ],
)
def test_check_strict_exits_1_on_any_advisory(args: list[str], env: dict[str, str], advised: bool, code: int) -> None:
    result = CliRunner().invoke(cli.main, ["check", *UPSTREAM, *args], env=env)
    assert result.exit_code == code, result.output
    assert bool(json.loads(result.output)["advisories"]) == advised, "the JSON is printed whatever the exit"


def test_check_strict_still_exits_2_on_a_hard_error() -> None:
    result = CliRunner().invoke(cli.main, ["check", *UPSTREAM, "--strict", "--shutdown-drain-secs", "1801"])
    assert result.exit_code == 2
    assert "--shutdown-drain-secs" in result.output


def test_check_strict_help_says_what_it_is_for() -> None:
    text = " ".join(run(["check", "--help"]).output.split())
    assert "--strict" in text and "CI gate" in text and "DRAIN_ROUTER_STRICT" in text


def test_help_carries_the_operational_meaning() -> None:
    text = " ".join(run(["serve", "--help"]).output.split())
    assert "failureThreshold * periodSeconds" in text
    assert "0 disables the pause" in text
    assert "terminationGracePeriodSeconds" in text
    assert "DRAIN_ROUTER_SHUTDOWN_DRAIN_SECS" in text


def test_top_level_help_lists_lazy_commands_without_importing_them() -> None:
    import sys

    sys.modules.pop("kopf", None)
    out = run(["--help"]).output
    listed = [line.split()[0] for line in out.split("Commands:")[1].splitlines() if line[:3].strip()]
    # What runs in a cluster, nothing else: the fake model and the demo are drain-router-dev's.
    assert listed == ["activator", "check", "controller", "front", "serve"], listed
    assert "kopf" not in sys.modules


def test_controller_without_the_extra_says_how_to_install_it():
    """Without kopf installed, `drain-router controller` names the missing extra and exits 2 (a usage
    error: nothing ran; 1 is a drain that aborted requests), no traceback."""
    import subprocess
    import sys

    code = "import sys; sys.modules['kopf'] = None; from drain_router.cli import main; main()"
    result = subprocess.run(
        [sys.executable, "-c", code, "controller", "--namespace", "models"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2, result.stderr
    assert "pip install 'drain-router[controller]'" in result.stderr
    assert "Traceback" not in result.stderr
