"""The Grafana dashboard the controller chart ships queries only metrics that exist: every metric name
in its PromQL is one the router's, the activator's or the controller's registry exports (read from the
registries themselves, so a renamed metric fails here), every query parses as PromQL (promtool), and
it covers what an operator watches during a rollout, a wake and an overload."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from drain_router import metrics as router_metrics
from drain_router.controller import metrics as controller_metrics
from tests.chart import values_sets
from tests.chart.helm import CONTROLLER_CHART, Helm, one

DASHBOARD = CONTROLLER_CHART / "dashboards" / "drain-router.json"

#: What every family type exposes, as Prometheus text format names it.
SUFFIXES = {"counter": ("_total", "_created"), "gauge": ("",), "histogram": ("_bucket", "_sum", "_count", "_created")}
#: Only these prefixes are metric names in the dashboard's queries (the rest is PromQL and labels).
METRIC = re.compile(r"\b((?:drain_router|process)_[a-z0-9_]+)\b")


def exported() -> set[str]:
    """Every sample name the router, the activator and the controller can export, from fresh
    registries."""
    registry = CollectorRegistry()
    router_metrics.Metrics(registry)
    router_metrics.ActivatorMetrics(registry)
    controller_metrics.ControllerMetrics(registry)
    names = set()
    for family in registry.collect():
        names.update(family.name + suffix for suffix in SUFFIXES.get(family.type, ("",)))
        names.update(sample.name for sample in family.samples)
    return names


def expressions(dashboard: dict[str, Any]) -> list[str]:
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel.get("targets", [])]
    exprs += [v["query"]["query"] for v in dashboard["templating"]["list"] if v["type"] == "query"]
    return exprs


def test_every_queried_metric_is_exported() -> None:
    names = exported()
    assert "drain_router_requests_total" in names and "process_open_fds" in names  # the check itself works
    queried = {m for expr in expressions(json.loads(DASHBOARD.read_text())) for m in METRIC.findall(expr)}
    assert queried, "no metric found in the dashboard"
    assert sorted(queried - names) == [], "the dashboard queries metrics nobody exports"


def test_the_dashboard_covers_a_rollout() -> None:
    queried = " ".join(expressions(json.loads(DASHBOARD.read_text())))
    for wanted in (
        "drain_router_inflight_requests",
        "drain_router_state",
        "drain_router_requests_total",
        "drain_router_time_to_first_byte_seconds_bucket",
        "drain_router_advisory",
        "drain_router_controller_recycle_held_pods",
    ):
        assert wanted in queried, wanted
    assert "by (outcome)" in queried, "requests by outcome"


def test_the_dashboard_covers_the_activator_phases_and_admission() -> None:
    """The activator (held requests, activations, activation seconds, timeouts, refusals, and the
    controller's wakes by outcome), ModelServices by phase (from the leader), admission (queue
    depth, queue wait, rejections by reason)."""
    exprs = expressions(json.loads(DASHBOARD.read_text()))
    queried = " ".join(exprs)
    for wanted in (
        "drain_router_activator_held_requests",
        "drain_router_activations_total",
        "drain_router_activation_seconds_bucket",
        "drain_router_activation_timeouts_total",
        "drain_router_activator_refused_total",
        "drain_router_queue_depth",
        "drain_router_queue_wait_seconds_bucket",
    ):
        assert wanted in queried, wanted
    for grouped in (
        "sum by (outcome) (increase(drain_router_controller_wakes_total[",
        "sum by (reason) (rate(drain_router_activator_refused_total[",
        'sum by (reason) (rate(drain_router_admission_rejections_total{namespace=~"$namespace"}[',
        "sum by (phase) (drain_router_controller_phase_services ",
    ):
        assert grouped in queried, grouped
    (phases,) = [e for e in exprs if "drain_router_controller_phase_services" in e]
    assert "drain_router_controller_leader == 1" in phases, "a standby's stale phases are not counted"


#: Grafana's variables, as a query would run: the PromQL promtool parses.
GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$__range": "1h", "$namespace": ".*"}


def test_every_query_parses_as_promql(tmp_path: Path) -> None:
    """Each query, its Grafana variables filled in, as a recording rule that ``promtool check rules``
    parses (a typo in the PromQL fails here, not in Grafana)."""
    promtool = shutil.which("promtool")
    if promtool is None:
        if os.environ.get("CI"):
            pytest.fail("promtool is required in CI (Debian's prometheus package)")
        pytest.skip("promtool not installed (Debian's prometheus package)")
    rules = []
    for i, expr in enumerate(expressions(json.loads(DASHBOARD.read_text()))):
        if expr.startswith("label_values("):
            continue
        for variable, value in GRAFANA_VARIABLES.items():
            expr = expr.replace(variable, value)
        rules.append({"record": f"dashboard:query_{i}", "expr": expr})
    assert len(rules) > 20
    (tmp_path / "dashboard.rules.yaml").write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    done = subprocess.run(
        [promtool, "check", "rules", "dashboard.rules.yaml"], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_config_map_carries_the_dashboard_for_grafanas_sidecar(helm: Helm) -> None:
    docs = helm.template(values_sets.CONTROLLER_CLUSTER, chart=CONTROLLER_CHART)
    config_map = one(docs, "ConfigMap")
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert config_map["metadata"]["namespace"] == "monitoring"
    assert config_map["metadata"]["annotations"] == {"grafana_folder": "LLM"}
    assert json.loads(config_map["data"]["drain-router.json"]) == json.loads(DASHBOARD.read_text())
    assert not [d for d in helm.template(chart=CONTROLLER_CHART) if d["kind"] == "ConfigMap"], "off by default"
