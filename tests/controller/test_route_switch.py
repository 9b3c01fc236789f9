"""``decisions/route_switch.py``: where a route points, and the patches that switch it to the
activator and back (the originals restored exactly). Pure: no cluster."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from click.testing import CliRunner

from drain_router import cli
from drain_router.decisions import activation, route_switch

from .emulator import _merge

ACTIVATOR = route_switch.ActivatorService(namespace="gw", name="activator", port=8012)
AT_ACTIVATOR = {"group": "", "kind": "Service", "name": "activator", "namespace": "gw", "port": 8012}
HEADER_FILTER = {
    "type": "RequestHeaderModifier",
    "requestHeaderModifier": {"set": [{"name": "x-drain-router-service", "value": "ns/llama"}]},
}
RULES = [
    {
        "matches": [{"path": {"type": "PathPrefix", "value": "/v1"}}],
        "backendRefs": [
            {"name": "llama", "port": 8080, "weight": 3},
            {"name": "llama-canary", "port": 8080, "weight": 1},
        ],
        "filters": [
            {"type": "RequestHeaderModifier", "requestHeaderModifier": {"add": [{"name": "x-a", "value": "1"}]}},
            {"type": "URLRewrite", "urlRewrite": {"path": {"type": "ReplacePrefixMatch", "replacePrefixMatch": "/"}}},
        ],
        "timeouts": {"request": "600s"},
    },
    {"backendRefs": [{"name": "llama", "port": 8080}]},
]


def _route(rules: Any = RULES, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "llama", "namespace": "ns", "resourceVersion": "7"}
    if annotations is not None:
        meta["annotations"] = annotations
    return {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "HTTPRoute",
        "metadata": meta,
        "spec": {"rules": copy.deepcopy(rules)},
    }


def _apply(route: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """The patch as the API server applies a merge patch (the precondition checked separately)."""
    assert patch["metadata"].pop("resourceVersion") == route["metadata"]["resourceVersion"]
    return _merge(copy.deepcopy(route), patch)


def test_to_the_activator_and_back_restores_every_rule_exactly() -> None:
    route = _route()
    assert route_switch.classify(route, ACTIVATOR) is activation.Route.SERVICE
    asleep = _apply(route, route_switch.to_activator(route, ACTIVATOR, "ns/llama"))
    first, second = asleep["spec"]["rules"]
    assert first["backendRefs"] == second["backendRefs"] == [AT_ACTIVATOR]
    assert first["matches"] == RULES[0]["matches"] and first["timeouts"] == {"request": "600s"}
    # merged into the rule's own RequestHeaderModifier (one per rule), the other filters kept
    assert first["filters"] == [
        {
            "type": "RequestHeaderModifier",
            "requestHeaderModifier": {
                "add": [{"name": "x-a", "value": "1"}],
                "set": [{"name": "x-drain-router-service", "value": "ns/llama"}],
            },
        },
        RULES[0]["filters"][1],
    ]
    assert second["filters"] == [HEADER_FILTER]
    saved = json.loads(asleep["metadata"]["annotations"][route_switch.ANNOTATION])
    assert saved == [
        {"backendRefs": RULES[0]["backendRefs"], "filters": RULES[0]["filters"]},
        {"backendRefs": RULES[1]["backendRefs"]},
    ]
    assert route_switch.classify(asleep, ACTIVATOR) is activation.Route.ACTIVATOR

    awake = _apply(asleep, route_switch.to_service(asleep))
    assert awake["spec"]["rules"] == RULES
    assert route_switch.ANNOTATION not in (awake["metadata"].get("annotations") or {})
    assert route_switch.classify(awake, ACTIVATOR) is activation.Route.SERVICE


def test_the_header_replaces_a_value_a_client_or_rule_would_set() -> None:
    rules = [
        {
            "backendRefs": [{"name": "llama"}],
            "filters": [
                {
                    "type": "RequestHeaderModifier",
                    "requestHeaderModifier": {
                        "set": [{"name": "X-Drain-Router-Service", "value": "other/x"}],
                        "remove": ["x-drain-router-service"],
                    },
                }
            ],
        }
    ]
    patch = route_switch.to_activator(_route(rules), ACTIVATOR, "ns/llama")
    assert patch["spec"]["rules"][0]["filters"] == [HEADER_FILTER]


@pytest.mark.parametrize(
    ("rules", "annotations", "expected"),
    [
        pytest.param([], None, activation.Route.UNKNOWN, id="no-rules"),
        pytest.param(
            [{"backendRefs": [AT_ACTIVATOR]}], None, activation.Route.UNKNOWN, id="at-activator-nothing-saved"
        ),
        pytest.param(
            [{"backendRefs": [AT_ACTIVATOR]}],
            {route_switch.ANNOTATION: "not json"},
            activation.Route.UNKNOWN,
            id="saved-unreadable",
        ),
        pytest.param(
            [{"backendRefs": [AT_ACTIVATOR]}],
            {route_switch.ANNOTATION: "[{}, {}]"},
            activation.Route.UNKNOWN,
            id="saved-for-other-rules",
        ),
        pytest.param(
            [{"backendRefs": [AT_ACTIVATOR]}],
            {route_switch.ANNOTATION: "[{}]"},
            activation.Route.ACTIVATOR,
            id="at-activator",
        ),
        pytest.param(
            [{"backendRefs": [AT_ACTIVATOR]}, {"backendRefs": [{"name": "llama"}]}],
            {route_switch.ANNOTATION: "[{}, {}]"},
            activation.Route.UNKNOWN,
            id="half-switched",
        ),
        pytest.param(
            [{"backendRefs": [AT_ACTIVATOR, {"name": "llama"}]}],
            {route_switch.ANNOTATION: "[{}]"},
            activation.Route.UNKNOWN,
            id="activator-beside-service",
        ),
        pytest.param(
            [{"backendRefs": [{"name": "llama"}]}],
            {route_switch.ANNOTATION: "[{}]"},
            activation.Route.SERVICE,
            id="stale-annotation-after-an-upgrade",
        ),
        pytest.param(
            [{"backendRefs": [{**AT_ACTIVATOR, "namespace": "elsewhere"}]}],
            None,
            activation.Route.SERVICE,
            id="same-name-other-namespace",
        ),
        pytest.param(
            [{"backendRefs": [{"name": "activator", "port": 8012}]}],
            None,
            activation.Route.SERVICE,
            id="same-name-route-namespace",
        ),
    ],
)
def test_classify(rules: Any, annotations: dict[str, str] | None, expected: activation.Route) -> None:
    assert route_switch.classify(_route(rules, annotations), ACTIVATOR) is expected


def test_a_grpc_route_points_at_the_activators_grpc_port_when_it_has_one() -> None:
    """``--activator-service gw/activator:8012,8013``: a GRPCRoute's rules at 8013, an HTTPRoute's at
    8012; without a gRPC port both at 8012. Either way it is classified at the activator, and back."""
    with_grpc = route_switch.parse_activator_service("gw/activator:8012,8013")
    assert with_grpc == route_switch.ActivatorService(namespace="gw", name="activator", port=8012, grpc_port=8013)
    assert str(with_grpc) == "gw/activator:8012,8013" and str(ACTIVATOR) == "gw/activator:8012"
    grpc_route = {**_route(), "kind": "GRPCRoute"}
    for activator, route, port in (
        (with_grpc, grpc_route, 8013),
        (with_grpc, _route(), 8012),
        (ACTIVATOR, grpc_route, 8012),
    ):
        patch = route_switch.to_activator(route, activator, "ns/llama")
        assert {ref["port"] for rule in patch["spec"]["rules"] for ref in rule["backendRefs"]} == {port}
        switched = {**route, "metadata": {**route["metadata"], **patch["metadata"]}, "spec": patch["spec"]}
        assert route_switch.classify(switched, activator) is activation.Route.ACTIVATOR
        back = route_switch.to_service(switched)
        assert back["spec"]["rules"] == route["spec"]["rules"]


def test_no_resource_version_no_precondition() -> None:
    route = _route()
    del route["metadata"]["resourceVersion"]
    assert "resourceVersion" not in route_switch.to_activator(route, ACTIVATOR, "ns/llama")["metadata"]


@pytest.mark.parametrize(
    "text",
    [
        "gw/activator",
        "activator:8012",
        "gw/activator:0",
        "gw/activator:65536",
        "GW/activator:80",
        "gw/act.ivator:80",
        "gw/activator:http",
        "gw/activator:8080,0",
        "gw/activator:8080,",
        "gw/activator:8080,8081,8082",
    ],
)
def test_an_invalid_activator_service_is_a_usage_error(text: str) -> None:
    with pytest.raises(ValueError, match="not"):
        route_switch.parse_activator_service(text)
    result = CliRunner().invoke(cli.main, ["controller", "--namespace", "ns", "--activator-service", text])
    assert result.exit_code == 2 and "--activator-service" in result.output, result.output


def test_the_flag_reaches_the_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    from drain_router.controller import operator

    seen: list[Any] = []
    monkeypatch.setattr(operator, "run", lambda settings: seen.append(settings) or 0)
    result = CliRunner().invoke(
        cli.main,
        ["controller", "--namespace", "ns", "--no-leader-election", "--activator-service", "gw/activator:8012"],
    )
    assert result.exit_code == 0, result.output
    assert seen[0].activator_service == ACTIVATOR and str(ACTIVATOR) == "gw/activator:8012"
    result = CliRunner().invoke(cli.main, ["controller", "--namespace", "ns", "--no-leader-election"])
    assert result.exit_code == 0 and seen[1].activator_service is None
