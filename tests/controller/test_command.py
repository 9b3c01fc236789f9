"""``drain-router controller`` as a user runs it: a real process, its output read line by line."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import kmock
import yaml

from drain_router_dev import process as process_

from .conftest import NAMESPACE, eventually
from .emulator import ClusterEmulator

REPO = Path(__file__).resolve().parents[2]


def _argv(*args: str) -> list[str]:
    return [
        *(sys.executable, "-m", "drain_router", "controller", "--namespace", NAMESPACE),
        *("--metrics-port", "0", "--liveness-port", "0", *args),
    ]


def _env(home: Path, **extra: str) -> dict[str, str]:
    """This environment without any way to a cluster: no service account host, an empty home."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBERNETES_", "KUBECONFIG"))}
    return {**env, "HOME": str(home), **extra}


def _kubeconfig(path: Path, server: str) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "test", "cluster": {"server": server}}],
                "users": [{"name": "test", "user": {}}],
                "contexts": [{"name": "test", "context": {"cluster": "test", "user": "test"}}],
                "current-context": "test",
            }
        )
    )
    return path


async def test_logs_json_lines_like_the_router_kopf_included(
    cluster: tuple[ClusterEmulator, kmock.Server], tmp_path: Path
) -> None:
    """1. a kubeconfig for the emulated API server 2. ``drain-router controller`` started with it
    3. kopf logs in and starts watching 4. SIGTERM.
    Result: every line it wrote is one JSON object with ``event``, ``level`` and ``timestamp``, kopf's
    own records among them (``logger`` kopf.*); it exits 0."""
    _, server = cluster
    kubeconfig = _kubeconfig(tmp_path / "kubeconfig", str(server.url).rstrip("/"))
    proc = process_.Process(
        "controller",
        _argv(),
        tmp_path / "controller.log",
        env=_env(tmp_path, KUBECONFIG=str(kubeconfig)),
        cwd=REPO,
    )
    proc.start()
    lines: list[str] = []
    try:

        def kopf_logged() -> bool:
            lines.extend(proc.new_lines())
            return any("kopf." in line for line in lines) or not proc.alive

        await eventually(kopf_logged, timeout=30, what="a log line from kopf")
        proc.signal(signal.SIGTERM)
        assert await proc.wait_exit(timeout=30) == 0, proc.log_tail()
    finally:
        proc.kill()
    lines.extend(proc.new_lines())
    events: list[dict[str, Any]] = []
    for line in lines:
        try:
            events.append(json.loads(line))
        except ValueError:
            raise AssertionError(f"not a JSON line: {line!r}") from None
    assert all({"event", "level", "timestamp"} <= event.keys() for event in events), events
    assert any(event.get("logger", "").startswith("kopf.") and event["level"] == "info" for event in events), events


def test_outside_a_cluster_says_why_and_what_to_do_in_one_line(tmp_path: Path) -> None:
    """1. no in-cluster environment, an empty HOME, no KUBECONFIG 2. ``drain-router controller``.
    Result: exit status 2 (a configuration error, as for ``serve``) and one line, a JSON log event
    naming the cause (no kubeconfig where it looked) and the remedy; no traceback."""
    result = subprocess.run(
        _argv(), env=_env(tmp_path), cwd=REPO, capture_output=True, text=True, timeout=60, check=False
    )
    output = (result.stdout + result.stderr).splitlines()
    assert result.returncode == 2, output
    assert len(output) == 1, output
    event = json.loads(output[0])
    assert event["event"] == "controller.no_cluster" and event["level"] == "error"
    assert "not in a cluster" in event["error"] and str(tmp_path / ".kube" / "config") in event["error"]
    assert "KUBECONFIG" in event["remedy"]


def test_the_liveness_port_default_is_the_charts() -> None:
    """``drain-router controller`` serves /healthz, without --liveness-port, on the port the chart's
    livenessProbe reads (values.yaml's health.port): the command defaulted to 0 (none) while the
    chart set 8081."""
    from drain_router.controller.command import command

    chart = yaml.safe_load((REPO / "charts" / "drain-router-controller" / "values.yaml").read_text())
    option = next(p for p in command.params if p.name == "liveness_port")
    assert option.default == chart["health"]["port"] != 0


def test_the_activator_admin_port_default_is_the_charts() -> None:
    """--activator-admin-port defaults to the chart's activator.adminPort: where the controller asks
    an activator pod which ports it listens on."""
    from drain_router.controller.command import command

    chart = yaml.safe_load((REPO / "charts" / "drain-router-controller" / "values.yaml").read_text())
    option = next(p for p in command.params if p.name == "activator_admin_port")
    assert option.default == chart["activator"]["adminPort"]


def test_an_old_activator_service_port_is_accepted_ignored_and_logged(tmp_path: Path) -> None:
    """1. ``--activator-service gw/activator:8080,8081`` (the syntax of the route switch) 2. no
    cluster. Result: the flag is accepted; before the no-cluster line, one warning
    ``controller.deprecated_flag`` naming the ignored suffix."""
    result = subprocess.run(
        _argv("--activator-service", "gw/activator:8080,8081"),
        env=_env(tmp_path),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    events = [json.loads(line) for line in (result.stdout + result.stderr).splitlines()]
    assert result.returncode == 2 and [e["event"] for e in events] == [
        "controller.deprecated_flag",
        "controller.no_cluster",
    ]
    assert events[0]["level"] == "warning" and events[0]["ignored"] == ":8080,8081"


def test_a_malformed_activator_service_or_port_range_is_a_usage_error(tmp_path: Path) -> None:
    for args, message in (
        (("--activator-service", "activator"), "is not <namespace>/<name>"),
        (("--activator-service", "gw/activator", "--activator-ports", "21000-20000"), "FIRST <= LAST"),
    ):
        result = subprocess.run(
            _argv(*args), env=_env(tmp_path), cwd=REPO, capture_output=True, text=True, timeout=60, check=False
        )
        assert result.returncode == 2 and message in result.stderr, result.stderr
