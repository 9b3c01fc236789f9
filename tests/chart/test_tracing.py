"""The charts' tracing values: off by default (``--no-tracing``, no OTEL_* variables); on, the flag and
the standard OTEL_* variables on the router container (model chart) and the controller."""

from __future__ import annotations

from typing import Any

from tests.chart.helm import CONTROLLER_CHART, Helm, containers, find

ON = {
    "enabled": True,
    "endpoint": "http://otel-collector.observability:4318",
    "sampler": "parentbased_traceidratio",
    "samplerArg": "0.25",
    "serviceName": "llama-router",
}
OTEL = {
    "OTEL_EXPORTER_OTLP_ENDPOINT": "http://otel-collector.observability:4318",
    "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
    "OTEL_TRACES_SAMPLER_ARG": "0.25",
    "OTEL_SERVICE_NAME": "llama-router",
}


def _env(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in container.get("env") or []}


def test_the_router_is_traced_only_when_asked(helm: Helm) -> None:
    off = containers(helm.template())["router"]
    assert "--no-tracing" in off["args"] and "--tracing" not in off["args"]
    assert not [k for k in _env(off) if k.startswith("OTEL_")]
    on = containers(helm.template({"router": {"tracing": ON, "env": [{"name": "X", "value": "1"}]}}))["router"]
    assert "--tracing" in on["args"] and "--no-tracing" not in on["args"]
    env = _env(on)
    assert {k: v for k, v in env.items() if k.startswith("OTEL_")} == OTEL
    assert env["X"] == "1"  # router.env still rendered after them


def test_the_controller_is_traced_only_when_asked(helm: Helm) -> None:
    def controller(values: dict[str, Any] | None) -> dict[str, Any]:
        [dep] = find(helm.template(values, chart=CONTROLLER_CHART), "Deployment")
        [c] = dep["spec"]["template"]["spec"]["containers"]
        return c

    off = controller(None)
    assert "--no-tracing" in off["args"]
    assert not [k for k in _env(off) if k.startswith("OTEL_")]
    on = controller({"tracing": ON})
    assert "--tracing" in on["args"]
    assert {k: v for k, v in _env(on).items() if k.startswith("OTEL_")} == OTEL
    assert "POD_NAME" in _env(on)


def _schema_has(schema: dict[str, Any], dotted: str) -> bool:
    node = schema
    for key in dotted.split("."):
        node = (node.get("properties") or {}).get(key)
        if node is None:
            return False
    return True


def test_every_chart_value_docs_tracing_names_is_in_the_schema() -> None:
    """docs/tracing.md tells users which values set the router's OTEL_* variables: each `router.*` it
    names must be one the model chart's schema accepts (it refuses unknown keys)."""
    import json
    import re

    from tests.chart.helm import CHART, REPO

    schema = json.loads((CHART / "values.schema.json").read_text())
    named = set(re.findall(r"`(router\.[\w.]+)`", (REPO / "docs" / "tracing.md").read_text()))
    assert {"router.tracing.enabled", "router.env"} <= named
    assert sorted(n for n in named if not _schema_has(schema, n)) == []
