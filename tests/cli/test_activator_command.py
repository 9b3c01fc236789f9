"""``drain-router activator`` only translates: flags and DRAIN_ROUTER_ACTIVATOR_* variables -> the
router's Config and ActivatorSettings -> process.serve; bad values exit 2 naming the flag."""

from __future__ import annotations

from typing import Any

import pytest
from click.testing import CliRunner

from drain_router import cli, config, early_signals
from drain_router.activator import process
from drain_router.activator.settings import ActivatorSettings

API = ["--kube-api", "http://127.0.0.1:6443", "--ports-configmap", "drain-router/activator-ports"]


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> list[tuple[config.Config, ActivatorSettings]]:
    seen: list[tuple[config.Config, ActivatorSettings]] = []

    def fake_serve(cfg: config.Config, settings: ActivatorSettings, **kwargs: Any) -> int:
        seen.append((cfg, settings))
        return 0

    monkeypatch.setattr(process, "serve", fake_serve)
    monkeypatch.setattr(early_signals, "install", lambda: None)
    monkeypatch.setattr("drain_router.logs.configure", lambda **kw: None)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    return seen


def run(args: list[str], env: dict[str, str] | None = None) -> Any:
    return CliRunner().invoke(cli.main, ["activator", *args], env=env, catch_exceptions=False)


def test_the_defaults(served) -> None:
    assert run(API).exit_code == 0
    [(cfg, settings)] = served
    assert settings == ActivatorSettings(
        kube_api="http://127.0.0.1:6443", ports_configmap="drain-router/activator-ports"
    )
    assert (settings.queue_size, settings.activation_timeout_secs, settings.max_services) == (1000, 600, 1000)
    assert settings.poll_interval_secs == 1
    assert (cfg.admin.port, cfg.drain.shutdown_drain_secs) == (9091, 30)


def test_the_port_map_from_the_flag_or_its_variable(served) -> None:
    assert run(API[:2], env={"DRAIN_ROUTER_ACTIVATOR_PORTS_CONFIGMAP": "ns/map"}).exit_code == 0
    assert [settings.ports_configmap for _, settings in served] == ["ns/map"]


@pytest.mark.parametrize("removed", ["--port", "--grpc-port"])
def test_no_shared_traffic_port(served, removed: str) -> None:
    """A request's service is its port's: there is no port for every service any more."""
    result = CliRunner().invoke(cli.main, ["activator", *API, removed, "8081"])
    assert result.exit_code == 2 and "No such option" in result.output, result.output


def test_flags_and_variables_map_into_the_settings(served) -> None:
    args = [*API, "--queue-size", "5", "--activation-timeout-secs", "2", "--poll-interval-secs", "0.25"]
    args += ["--admin-port", "0", "--shutdown-drain-secs", "0", "--log-level", "debug"]
    assert run(args, env={"DRAIN_ROUTER_ACTIVATOR_MAX_SERVICES": "7"}).exit_code == 0
    [(cfg, settings)] = served
    assert (settings.queue_size, settings.activation_timeout_secs, settings.max_services) == (5, 2, 7)
    assert settings.poll_interval_secs == 0.25
    assert (cfg.admin.port, cfg.drain.shutdown_drain_secs, cfg.log.level) == (0, 0, "debug")


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--queue-size", "0"], "--queue-size"),
        (["--activation-timeout-secs", "0"], "--activation-timeout-secs"),
        (["--max-services", "x"], "--max-services"),
        (["--poll-interval-secs", "0"], "--poll-interval-secs"),
        (["--admin-port", "70000"], "--admin-port"),
        (["--shutdown-drain-secs", "1801"], "--shutdown-drain-secs"),
        (["--ports-configmap", "a/b/c"], "--ports-configmap"),
        (["--ports-configmap", "just-a-name"], "--ports-configmap"),  # out of cluster: no namespace
    ],
)
def test_a_bad_value_exits_2_naming_its_flag(served, args: list[str], named: str) -> None:
    result = CliRunner().invoke(cli.main, ["activator", *API, *args])
    assert result.exit_code == 2 and named in result.output, result.output
    assert served == []


def test_without_kube_api_the_command_serves_and_the_login_is_the_process_s(served) -> None:
    """Out of cluster without ``--kube-api`` is no usage error: the process finds the API server as
    the controller does (KUBECONFIG, ~/.kube/config; tests/activator/test_login.py)."""
    assert run(API[2:]).exit_code == 0
    [(_, settings)] = served
    assert settings.kube_api is None


def test_without_the_port_map_exits_2(served) -> None:
    result = CliRunner().invoke(cli.main, ["activator", *API[:2]])
    assert result.exit_code == 2 and "--ports-configmap" in result.output
    assert served == []
