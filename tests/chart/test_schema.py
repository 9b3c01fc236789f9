"""values.schema.json and the render-time checks refuse what would break draining."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from drain_router import config
from drain_router.decisions import websocket_close
from tests.chart.helm import Helm, containers, flag


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        pytest.param({"shutdownDrainSecs": 1801, "terminationGraceSecs": 3600}, "/shutdownDrainSecs", id="drain-1801"),
        pytest.param({"shutdownDrainSecs": -1}, "/shutdownDrainSecs", id="negative-drain"),
        pytest.param({"shutdownDrainSecs": 30.5}, "/shutdownDrainSecs", id="fractional-drain"),
        pytest.param({"terminationGraceSecs": -5}, "/terminationGraceSecs", id="negative-grace"),
        pytest.param({"terminationGraceSecs": 0}, "/terminationGraceSecs", id="zero-grace"),
        pytest.param({"terminationGraceSecs": "180"}, "/terminationGraceSecs", id="string-grace"),
        pytest.param({"router": {"adminPort": 70000}}, "/router/adminPort", id="port-range"),
        pytest.param({"router": {"securityContext": {"runAsNonRoot": False}}}, "runAsNonRoot", id="root-router"),
        pytest.param({"router": {"readinesProbe": {}}}, "readinesProbe", id="typo-key"),
        pytest.param({"router": {"websocketCloseAt": "never"}}, "websocketCloseAt", id="websocket-close-at"),
        pytest.param({"httpRoute": {"enabled": True}}, "/httpRoute/parentRefs", id="route-without-parent"),
        pytest.param({"modelService": {"deletion": {"routeSettle": "1 minute"}}}, "routeSettle", id="bad-duration"),
        pytest.param(
            {"modelService": {"lifecycleRules": [{"policy": "Nuke", "condition": {"idleSeconds": 1}}]}},
            "policy",
            id="unknown-policy",
        ),
    ],
)
def test_schema_rejects(helm: Helm, values: dict[str, Any], expected: str) -> None:
    error = helm.template_error(values)
    assert "schema" in error
    assert expected in error


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        pytest.param({"shutdownDrainSecs": 180}, "must be below terminationGraceSecs", id="drain-equals-grace"),
        pytest.param(
            {"shutdownDrainSecs": 60, "terminationGraceSecs": 30}, "shutdownDrainSecs (60)", id="drain-over-grace"
        ),
        pytest.param({"shutdownDrainSecs": 15}, "must be above the readiness probe window", id="drain-equals-window"),
        pytest.param({"shutdownDrainSecs": 0}, "shutdownDrainSecs (0) must be above", id="no-drain-probe-declared"),
        pytest.param({"router": {"adminPort": 8080}}, "router.port and router.adminPort", id="same-router-ports"),
        pytest.param({"modelServer": {"port": 9091}}, "modelServer.port 9091 collides", id="model-port-collides"),
    ],
)
def test_render_checks_refuse(helm: Helm, values: dict[str, Any], expected: str) -> None:
    assert expected in helm.template_error(values)


@pytest.mark.parametrize(("drain", "grace", "declared"), [(0, 1, False), (1800, 1802, True), (16, 30, True)])
def test_edges_that_are_accepted(helm: Helm, drain: int, grace: int, declared: bool) -> None:
    """No drain is accepted only when the probe is not declared to the router (no balancer follows
    it); with the default probe (5 s x 3) the drain must be above 15 s."""
    probe = {"readinessProbe": {"declareToRouter": declared}}
    values = {"shutdownDrainSecs": drain, "terminationGraceSecs": grace, "router": probe}
    args = containers(helm.template(values))["router"]["args"]
    assert flag(args, "--shutdown-drain-secs") == str(drain)
    assert flag(args, "--termination-grace-secs") == str(grace)


def test_websocket_close_at_offers_the_routers_choices_and_default() -> None:
    """The chart's value is passed to --websocket-close-at: the same choices, and the same default."""
    chart = Path(__file__).resolve().parents[2] / "charts" / "drain-router"
    schema = json.loads((chart / "values.schema.json").read_text())
    assert set(schema["properties"]["router"]["properties"]["websocketCloseAt"]["enum"]) == set(websocket_close.MODES)
    values = yaml.safe_load((chart / "values.yaml").read_text())
    assert values["router"]["websocketCloseAt"] == websocket_close.DEFAULT == config.DrainSettings().websocket_close_at
