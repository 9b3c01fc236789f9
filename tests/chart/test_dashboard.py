"""The Grafana dashboard the controller chart ships queries only metrics that exist: every metric name
in its PromQL is one the router's or the controller's registry exports (read from the registries
themselves, so a renamed metric fails here), and it covers what an operator watches during a rollout."""

from __future__ import annotations

import json
import re
from typing import Any

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
    """Every sample name the router and the controller can export, from fresh registries."""
    registry = CollectorRegistry()
    router_metrics.Metrics(registry)
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


def test_config_map_carries_the_dashboard_for_grafanas_sidecar(helm: Helm) -> None:
    docs = helm.template(values_sets.CONTROLLER_CLUSTER, chart=CONTROLLER_CHART)
    config_map = one(docs, "ConfigMap")
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert config_map["metadata"]["namespace"] == "monitoring"
    assert config_map["metadata"]["annotations"] == {"grafana_folder": "LLM"}
    assert json.loads(config_map["data"]["drain-router.json"]) == json.loads(DASHBOARD.read_text())
    assert not [d for d in helm.template(chart=CONTROLLER_CHART) if d["kind"] == "ConfigMap"], "off by default"
