"""The charts' PrometheusRules, proved with Prometheus's own promtool: rendered by the real helm,
their groups written as a rules file, ``promtool check rules`` on it, and the unit tests of
``tests/chart/alerts/*.test.yaml`` (one per alert, firing and not firing) run against it.

promtool comes with Debian's ``prometheus`` package; without it these tests skip, and fail when
``CI`` is set (CI installs it).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from drain_router import metrics as router_metrics
from drain_router.controller import metrics as controller_metrics
from tests.chart.helm import CHART, CONTROLLER_CHART, Helm, one

ALERTS = Path(__file__).parent / "alerts"
RUNBOOK = Path(__file__).resolve().parents[2] / "docs" / "runbook.md"
ENABLED = {"monitoring": {"prometheusRule": {"enabled": True}}}
#: The controller chart's rules with the activator's alerts too (they come with activator.enabled).
WITH_ACTIVATOR = {**ENABLED, "activator": {"enabled": True}}
#: (chart, release, namespace, the rules file its unit tests name, the values it is rendered with)
CHARTS = {
    "router": (CHART, "llama", "models", "router.rules.yaml", ENABLED),
    "controller": (
        CONTROLLER_CHART,
        "drain-router-controller",
        "drain-router-system",
        "controller.rules.yaml",
        WITH_ACTIVATOR,
    ),
}
ACTIVATOR_ALERTS = ["DrainRouterActivationTimeouts", "DrainRouterWakeFailed"]


@pytest.fixture(scope="module")
def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        if os.environ.get("CI"):
            pytest.fail("promtool is required in CI (Debian's prometheus package)")
        pytest.skip("promtool not installed (Debian's prometheus package)")
    return found


def rules_file(helm: Helm, which: str, directory: Path) -> Path:
    """The chart's PrometheusRule (default values, enabled; the controller's with its activator) as
    a Prometheus rules file."""
    chart, release, namespace, name, values = CHARTS[which]
    rule = one(helm.template(values, chart=chart, release=release, namespace=namespace), "PrometheusRule")
    path = directory / name
    path.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    return path


def promtool_run(promtool: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool, *args], cwd=cwd, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("which", sorted(CHARTS))
def test_promtool_checks_the_rules(helm: Helm, promtool: str, which: str, tmp_path: Path) -> None:
    path = rules_file(helm, which, tmp_path)
    done = promtool_run(promtool, "check", "rules", path.name, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    alerts = [r["alert"] for g in yaml.safe_load(path.read_text())["groups"] for r in g["rules"]]
    tested = yaml.safe_load((ALERTS / f"{which}.test.yaml").read_text())["tests"]
    assert sorted(t["name"] for t in tested) == sorted(alerts), "one unit test per alert"
    runbook = (RUNBOOK).read_text().splitlines()
    for rule in (r for g in yaml.safe_load(path.read_text())["groups"] for r in g["rules"]):
        assert rule["annotations"]["runbook_url"].endswith("/docs/runbook.md#" + rule["alert"].lower())
        assert f"## {rule['alert']}" in runbook, f"docs/runbook.md has no section for {rule['alert']}"


@pytest.mark.parametrize("which", sorted(CHARTS))
def test_promtool_unit_tests_fire_and_stay_silent(helm: Helm, promtool: str, which: str, tmp_path: Path) -> None:
    rules_file(helm, which, tmp_path)
    shutil.copy(ALERTS / f"{which}.test.yaml", tmp_path)
    done = promtool_run(promtool, "test", "rules", f"{which}.test.yaml", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_activators_alerts_come_with_the_activator(helm: Helm) -> None:
    """Without activator.enabled no wake happens and no activator runs: none of its alerts."""

    def alerts(values: dict[str, Any]) -> list[str]:
        rule = one(helm.template(values, chart=CONTROLLER_CHART), "PrometheusRule")
        return sorted(r["alert"] for g in rule["spec"]["groups"] for r in g["rules"])

    assert not set(ACTIVATOR_ALERTS) & set(alerts(ENABLED))
    assert set(ACTIVATOR_ALERTS) <= set(alerts(WITH_ACTIVATOR))


def test_the_counters_the_new_alerts_read_exist_at_zero_from_the_start() -> None:
    """The alerts fire on increase(): a series born at 1 (its first event) has no increase to see.
    Every counter they read is exported at 0 before its first event, under the names they query."""
    registry = CollectorRegistry()
    router_metrics.Metrics(registry)
    router_metrics.ActivatorMetrics(registry)
    controller_metrics.ControllerMetrics(registry)
    for name, labels in [
        ("drain_router_controller_wakes_total", {"outcome": "failed"}),
        ("drain_router_activation_timeouts_total", {}),
        ("drain_router_admission_rejections_total", {"reason": "queue_timeout"}),
        ("drain_router_admission_rejections_total", {"reason": "queue_full"}),
    ]:
        assert registry.get_sample_value(name, labels) == 0, (name, labels)


def test_off_by_default(helm: Helm) -> None:
    for chart, release, namespace, _, _ in CHARTS.values():
        docs = helm.template(chart=chart, release=release, namespace=namespace)
        assert not [d for d in docs if d["kind"] == "PrometheusRule"]
