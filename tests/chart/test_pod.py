"""The model server pod: one grace value in both places, the preStop hold, probes, non-root."""

from __future__ import annotations

from typing import Any

import pytest

from tests.chart import values_sets
from tests.chart.helm import Helm, component, containers, find, flag, model_deployment, model_service

#: The engine presets' ports (modelServer.port null).
PRESET_PORTS = {"vllm": 8000, "sglang": 30000, "tgi": 8000, "llamacpp": 8000}


def engine_port(values: dict[str, Any]) -> int:
    return values["modelServer"]["port"] or PRESET_PORTS[values["modelServer"]["engine"]]


@pytest.fixture(params=values_sets.WITH_WORKLOAD)
def rendered(request: pytest.FixtureRequest, helm: Helm) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(effective values, rendered documents) for each value set with a model server."""
    return values_sets.merged(request.param), helm.template(request.param)


def test_one_grace_value_feeds_pod_grace_and_router_flag(rendered: tuple[dict[str, Any], list[Any]]) -> None:
    values, docs = rendered
    pod = model_deployment(docs)["spec"]["template"]["spec"]
    args = containers(docs)["router"]["args"]
    assert pod["terminationGracePeriodSeconds"] == values["terminationGraceSecs"]
    assert flag(args, "--termination-grace-secs") == str(values["terminationGraceSecs"])
    assert flag(args, "--shutdown-drain-secs") == str(values["shutdownDrainSecs"])
    assert int(flag(args, "--shutdown-drain-secs") or 0) < pod["terminationGracePeriodSeconds"]


def test_router_args_point_at_the_model_server_and_the_declared_ports(
    rendered: tuple[dict[str, Any], list[Any]],
) -> None:
    values, docs = rendered
    router = containers(docs)["router"]
    args = router["args"]
    assert args[0] == "serve"
    assert flag(args, "--upstream") == f"http://127.0.0.1:{engine_port(values)}"
    assert flag(args, "--port") == str(values["router"]["port"])
    assert flag(args, "--admin-port") == str(values["router"]["adminPort"])
    assert flag(args, "--websocket-close-at") == values["router"]["websocketCloseAt"]
    ports = {p["name"]: p["containerPort"] for p in router["ports"]}
    expected = {"http": values["router"]["port"], "admin": values["router"]["adminPort"]}
    if values["grpc"]["enabled"]:
        expected["grpc"] = values["grpc"]["port"]
        assert flag(args, "--grpc-port") == str(values["grpc"]["port"])
    else:
        assert flag(args, "--grpc-port") is None and flag(args, "--grpc-upstream") is None
    assert ports == expected
    for extra in values["router"]["extraArgs"]:
        assert extra in args


def test_model_server_prestop_holds_on_the_routers_drain_wait(rendered: tuple[dict[str, Any], list[Any]]) -> None:
    values, docs = rendered
    by_name = containers(docs)
    model = by_name[values["modelServer"]["name"]]
    assert model["lifecycle"]["preStop"] == {
        "httpGet": {"path": "/admin/drain-wait", "port": values["router"]["adminPort"]}
    }
    admin = {p["name"]: p["containerPort"] for p in by_name["router"]["ports"]}["admin"]
    assert model["lifecycle"]["preStop"]["httpGet"]["port"] == admin
    assert "lifecycle" not in by_name["router"], "the router itself must get SIGTERM at once"
    image = values["modelServer"]["image"]
    if image["repository"]:
        assert model["image"].startswith(image["repository"] + ":")
    if image["tag"]:
        assert model["image"].endswith(":" + image["tag"])


def test_router_is_a_regular_container_not_a_native_sidecar(rendered: tuple[dict[str, Any], list[Any]]) -> None:
    """Native sidecars are signalled after the main containers exit: the drain would start too late."""
    values, docs = rendered
    pod = model_deployment(docs)["spec"]["template"]["spec"]
    for init in pod.get("initContainers", []):
        assert init["name"] != "router" and "restartPolicy" not in init
    names = [c["name"] for c in pod["containers"]]
    assert names[:2] == ["router", values["modelServer"]["name"]]
    assert names[2:] == [c["name"] for c in values["workload"]["extraContainers"]]


def test_router_probes(rendered: tuple[dict[str, Any], list[Any]]) -> None:
    values, docs = rendered
    router = containers(docs)["router"]
    rp = values["router"]["readinessProbe"]
    if rp["protocol"] == "grpc":
        assert router["readinessProbe"]["grpc"]["port"] == values["grpc"]["port"]
    else:
        assert router["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "admin"}
    assert router["readinessProbe"]["periodSeconds"] == rp["periodSeconds"]
    assert router["readinessProbe"]["failureThreshold"] == rp["failureThreshold"]
    assert router["livenessProbe"]["httpGet"] == {"path": "/livez", "port": "admin"}
    args = router["args"]
    if rp["declareToRouter"]:
        assert flag(args, "--readiness-probe-period-secs") == str(rp["periodSeconds"])
        assert flag(args, "--readiness-probe-failure-threshold") == str(rp["failureThreshold"])
    else:
        assert flag(args, "--readiness-probe-period-secs") is None
        assert flag(args, "--readiness-probe-failure-threshold") is None


def test_router_runs_as_non_root(rendered: tuple[dict[str, Any], list[Any]]) -> None:
    _, docs = rendered
    sc = containers(docs)["router"]["securityContext"]
    assert sc["runAsNonRoot"] is True
    assert sc["runAsUser"] != 0
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}


def test_service_and_pdb_select_only_model_server_pods(rendered: tuple[dict[str, Any], list[Any]]) -> None:
    values, docs = rendered
    pod_labels = model_deployment(docs)["spec"]["template"]["metadata"]["labels"]
    service = model_service(docs)
    grpc_only = values["grpc"]["enabled"] and values["modelServer"]["engine"] in ("vllm", "sglang")
    expected = (
        []
        if grpc_only
        else [{"name": "http", "port": values["service"]["port"], "targetPort": "http", "protocol": "TCP"}]
    )
    if values["grpc"]["enabled"]:
        port = values["grpc"]["servicePort"]
        expected.append(
            {"name": "grpc", "port": port, "targetPort": "grpc", "protocol": "TCP", "appProtocol": "kubernetes.io/h2c"}
        )
    assert service["spec"]["ports"] == expected
    selectors = [service["spec"]["selector"]]
    if values["pdb"]["enabled"]:
        (pdb,) = [d for d in find(docs, "PodDisruptionBudget") if component(d) == "model-server"]
        selectors.append(pdb["spec"]["selector"]["matchLabels"])
    others = [
        d["spec"]["template"]["metadata"]["labels"] for d in find(docs, "Deployment") if component(d) != "model-server"
    ]
    assert len(others) == int(values["front"]["enabled"]), "the front's pods are the only others"
    for selector in selectors:
        assert selector.items() <= pod_labels.items()
        for labels in others:
            assert not selector.items() <= labels.items(), "the front's pods are neither served nor budgeted here"


def test_default_grace_leaves_room_after_the_drain() -> None:
    """The defaults never trigger DRAIN_CONSUMES_GRACE or DRAIN_SHORTER_THAN_PROBE_WINDOW."""
    values = values_sets.merged({})
    rp = values["router"]["readinessProbe"]
    assert values["shutdownDrainSecs"] < values["terminationGraceSecs"]
    assert values["shutdownDrainSecs"] > rp["periodSeconds"] * rp["failureThreshold"]
