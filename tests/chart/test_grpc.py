"""gRPC (grpc.enabled): the router's second traffic listener (--grpc-port, --grpc-upstream), the
Service port that targets it with appProtocol kubernetes.io/h2c, each engine preset's gRPC mode, the
readiness probe on the router's grpc.health.v1, the InferencePool on the gRPC port, the GRPCRoute,
the NetworkPolicy, and the checks that refuse what cannot work."""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest

from tests.chart import crds, values_sets
from tests.chart.helm import CHART, NAMESPACE, RELEASE, Helm, containers, find, flag, model_deployment, one
from tests.chart.test_networkpolicy import _allowed

FULLNAME = f"{RELEASE}-drain-router"
GRPC = {"grpc": {"enabled": True}}

#: engine: (the gRPC mode flag, the model server's port, the readiness service of its grpc.health.v1)
GRPC_ENGINES = {
    "vllm": ("--grpc", 8000, "vllm.grpc.engine.VllmEngine"),
    "sglang": ("--grpc-mode", 30000, "sglang.grpc.scheduler.SglangScheduler"),
}


def model_server(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return next(c for name, c in containers(docs).items() if name != "router")


def router(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return containers(docs)["router"]


def container_port(container: dict[str, Any], name: str) -> int:
    (port,) = [p["containerPort"] for p in container["ports"] if p["name"] == name]
    return int(port)


def service_port(docs: list[dict[str, Any]], name: str) -> dict[str, Any]:
    (port,) = [p for p in one(docs, "Service")["spec"]["ports"] if p["name"] == name]
    return port


def test_off_by_default_nothing_grpc_is_rendered(helm: Helm) -> None:
    docs = helm.template()
    args = router(docs)["args"]
    assert flag(args, "--grpc-port") is None and flag(args, "--grpc-upstream") is None
    assert [p["name"] for p in router(docs)["ports"]] == ["http", "admin"]
    assert [p["name"] for p in one(docs, "Service")["spec"]["ports"]] == ["http"]
    assert "--grpc" not in model_server(docs)["args"]
    assert not find(docs, "GRPCRoute")
    assert "appProtocol" not in one(helm.template(values_sets.INFERENCE_POOL), "InferencePool")["spec"]


@pytest.mark.parametrize(
    "values", [GRPC, values_sets.GRPC_POOL, values_sets.GRPC_TRITON], ids=["vllm", "pool", "triton"]
)
def test_service_grpc_port_is_h2c_and_targets_the_routers_grpc_listener(helm: Helm, values: dict[str, Any]) -> None:
    merged = values_sets.merged(values)
    docs = helm.template(values)
    port = service_port(docs, "grpc")
    assert port["appProtocol"] == "kubernetes.io/h2c"
    assert port["port"] == merged["grpc"]["servicePort"] and port["protocol"] == "TCP"
    # The named target resolves to the router's gRPC listener, which is what --grpc-port opens.
    assert port["targetPort"] == "grpc"
    assert container_port(router(docs), "grpc") == merged["grpc"]["port"]
    assert flag(router(docs)["args"], "--grpc-port") == str(merged["grpc"]["port"])
    server_ports = {int(flag(router(docs)["args"], "--upstream").rsplit(":", 1)[1])}
    server_ports.add(int(flag(router(docs)["args"], "--grpc-upstream").rsplit(":", 1)[1]))
    assert merged["grpc"]["port"] not in server_ports, "the Service never reaches the model server directly"
    names = [p["name"] for p in one(docs, "Service")["spec"]["ports"]]
    if merged["modelServer"]["engine"] in GRPC_ENGINES:
        assert names == ["grpc"], "an engine serving gRPC only gets no http port: nothing would answer it"
    else:
        assert names == ["http", "grpc"]
        assert service_port(docs, "http")["targetPort"] == "http", "the HTTP port stays as it was"


@pytest.mark.parametrize("engine", sorted(GRPC_ENGINES))
def test_presets_run_the_engine_in_grpc_mode_behind_the_router(helm: Helm, engine: str) -> None:
    mode_flag, port, _ = GRPC_ENGINES[engine]
    docs = helm.template({**GRPC, "modelServer": {"engine": engine, "args": ["--extra", "1"]}})
    args = model_server(docs)["args"]
    assert args.count(mode_flag) == 1
    assert args.index(mode_flag) < args.index("--extra"), "modelServer.args come after the preset's"
    assert flag(args, "--host") == "127.0.0.1", "only the router may reach it"
    assert flag(args, "--port") == str(port), "gRPC mode serves on the engine's own --port"
    router_args = router(docs)["args"]
    assert flag(router_args, "--grpc-upstream") == f"http://127.0.0.1:{port}"
    assert flag(router_args, "--upstream-health-path") is None, "no HTTP health to poll in gRPC mode"
    for probe in ("startupProbe", "livenessProbe"):
        command = model_server(docs)[probe]["exec"]["command"]
        assert command[:2] == ["python3", "-c"], (probe, command)
        assert f"create_connection(('127.0.0.1', {port})" in command[2], "a TCP connect to the gRPC port"
        assert f"timeout={model_server(docs)[probe]['timeoutSeconds']})" in command[2]
    http_only = helm.template({"modelServer": {"engine": engine}})
    assert mode_flag not in model_server(http_only)["args"]
    assert model_server(http_only)["startupProbe"]["exec"]["command"][0] == "curl"


def test_the_grpc_upstream_follows_the_model_server_port(helm: Helm) -> None:
    docs = helm.template({**GRPC, "modelServer": {"port": 8100}})
    assert flag(router(docs)["args"], "--grpc-upstream") == "http://127.0.0.1:8100"
    assert flag(model_server(docs)["args"], "--port") == "8100"


def test_triton_as_custom_serves_http_and_grpc_side_by_side(helm: Helm) -> None:
    docs = helm.template(values_sets.GRPC_TRITON)
    router_args = router(docs)["args"]
    assert flag(router_args, "--upstream") == "http://127.0.0.1:8000"
    assert flag(router_args, "--grpc-upstream") == "http://127.0.0.1:8001"
    assert flag(router_args, "--upstream-health-path") == "/v2/health/ready", "HTTP health still polled"
    server = model_server(docs)
    assert server["args"] == values_sets.GRPC_TRITON["modelServer"]["args"], "custom: the args are the user's"
    assert "--grpc-address=127.0.0.1" in server["args"]
    assert one(docs, "HTTPRoute") and one(docs, "GRPCRoute"), "both protocols routed"


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        pytest.param({"modelServer": {"engine": "tgi"}}, "engine tgi has no gRPC server", id="tgi"),
        pytest.param(
            {"modelServer": {"engine": "llamacpp", "model": "org/m-GGUF"}},
            "engine llamacpp has no gRPC server",
            id="llamacpp",
        ),
        pytest.param(
            {"modelServer": {"engine": "custom", "image": {"repository": "x", "tag": "1"}, "port": 8000}},
            "needs grpc.modelServerPort",
            id="custom-without-port",
        ),
        pytest.param(
            {"grpc": {"modelServerPort": 9000}},
            "vllm serves gRPC on its --port (modelServer.port 8000)",
            id="vllm-port",
        ),
    ],
)
def test_engines_refused_or_incomplete(helm: Helm, values: dict[str, Any], expected: str) -> None:
    values = {**values, "grpc": {"enabled": True, **values.get("grpc", {})}}
    assert expected in helm.template_error(values)


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        pytest.param({"grpc": {"port": 8080}}, "grpc.port 8080 collides with a router port", id="router-port"),
        pytest.param({"grpc": {"port": 9091}}, "grpc.port 9091 collides with a router port", id="admin-port"),
        pytest.param({"grpc": {"port": 8000}}, "grpc.port 8000 collides with a model server port", id="engine-port"),
        pytest.param(
            {**values_sets.GRPC_TRITON, "grpc": {"modelServerPort": 8001, "port": 8001}},
            "grpc.port 8001 collides with a model server port",
            id="engine-grpc-port",
        ),
        pytest.param(
            {**values_sets.GRPC_TRITON, "grpc": {"modelServerPort": 9091}},
            "grpc.modelServerPort 9091 collides with a router port",
            id="custom-grpc-on-admin",
        ),
        pytest.param(
            {**values_sets.GRPC_TRITON, "grpc": {"modelServerPort": 8001, "servicePort": 80}},
            "grpc.servicePort and service.port are both 80",
            id="service-port",
        ),
    ],
)
def test_port_collisions_are_refused(helm: Helm, values: dict[str, Any], expected: str) -> None:
    values = {**values, "grpc": {"enabled": True, **values["grpc"]}}
    assert expected in helm.template_error(values)


def test_a_grpc_only_engine_may_serve_grpc_on_the_http_service_port(helm: Helm) -> None:
    """vllm in gRPC mode has no http Service port, so service.port is unused and cannot collide."""
    docs = helm.template({"grpc": {"enabled": True, "servicePort": 80}})
    assert one(docs, "Service")["spec"]["ports"] == [
        {"name": "grpc", "port": 80, "targetPort": "grpc", "protocol": "TCP", "appProtocol": "kubernetes.io/h2c"}
    ]


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        pytest.param({"grpc": {"port": 0}}, "/grpc/port", id="port-range"),
        pytest.param({"grpc": {"servicePort": 70000}}, "/grpc/servicePort", id="service-port-range"),
        pytest.param({"grpc": {"enabled": "yes"}}, "/grpc/enabled", id="not-a-bool"),
        pytest.param({"grpc": {"engine": "vllm"}}, "engine", id="unknown-key"),
        pytest.param(
            {"router": {"readinessProbe": {"protocol": "tcp"}}}, "/router/readinessProbe/protocol", id="probe"
        ),
        pytest.param({"grpcRoute": {"enabled": True}}, "/grpcRoute/parentRefs", id="route-without-parent"),
        pytest.param({"grpcRoute": {"backend": "Pool"}}, "/grpcRoute/backend", id="route-backend"),
        pytest.param({"grpcRoute": {"methods": [{}]}}, "/grpcRoute/methods/0", id="empty-match"),
        pytest.param(
            {"grpcRoute": {"methods": [{"service": "a/b"}]}}, "/grpcRoute/methods/0/service", id="bad-service"
        ),
        pytest.param(
            {"grpcRoute": {"methods": [{"method": "Gen.erate"}]}}, "/grpcRoute/methods/0/method", id="bad-method"
        ),
        pytest.param({"grpcRoute": {"methods": [{"service": "s", "verb": "x"}]}}, "verb", id="unknown-match-key"),
    ],
)
def test_schema_refuses(helm: Helm, values: dict[str, Any], expected: str) -> None:
    error = helm.template_error(values)
    assert "schema" in error and expected in error, error


def test_a_regular_expression_match_is_not_held_to_the_exact_patterns(helm: Helm) -> None:
    route = one(helm.template(values_sets.GRPC_POOL), "GRPCRoute")
    assert route["spec"]["rules"][0]["matches"][1]["method"] == {
        "type": "RegularExpression",
        "service": "sglang\\.grpc\\..*",
    }


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        pytest.param(
            {"router": {"readinessProbe": {"protocol": "grpc"}}},
            "router.readinessProbe.protocol grpc needs grpc.enabled",
            id="grpc-probe",
        ),
        pytest.param(
            {"grpcRoute": {"enabled": True, "parentRefs": [{"name": "g"}]}},
            "grpcRoute.enabled needs grpc.enabled",
            id="grpc-route",
        ),
        pytest.param(
            {**GRPC, "httpRoute": {"enabled": True, "parentRefs": [{"name": "g"}]}},
            "vllm serves gRPC instead of HTTP in gRPC mode, so the HTTPRoute would reach no model server",
            id="http-route-to-grpc-only-engine",
        ),
        pytest.param(
            {**GRPC, "router": {"upstreamHealthPath": "/health"}},
            'router.upstreamHealthPath "/health" with grpc.enabled: vllm serves no HTTP in gRPC mode',
            id="http-health-of-grpc-only-engine",
        ),
        pytest.param(
            {
                **values_sets.GRPC_TRITON,
                "inferencePool": {"enabled": True, "endpointPicker": {"name": "epp"}},
                "httpRoute": {"enabled": True, "backend": "InferencePool", "parentRefs": [{"name": "g"}]},
            },
            "httpRoute.backend InferencePool with grpc.enabled: the pool targets the router's gRPC port",
            id="http-route-to-grpc-pool",
        ),
        pytest.param(
            {**GRPC, "grpcRoute": {"enabled": True, "backend": "InferencePool", "parentRefs": [{"name": "g"}]}},
            "grpcRoute.backend InferencePool needs inferencePool.enabled",
            id="grpc-route-to-missing-pool",
        ),
    ],
)
def test_render_checks_refuse(helm: Helm, values: dict[str, Any], expected: str) -> None:
    assert expected in helm.template_error(values)


@pytest.mark.parametrize("engine", sorted(GRPC_ENGINES))
def test_readiness_probe_can_ask_the_routers_grpc_health(helm: Helm, engine: str) -> None:
    _, _, service = GRPC_ENGINES[engine]
    values = {**GRPC, "router": {"readinessProbe": {"protocol": "grpc"}}, "modelServer": {"engine": engine}}
    probe = router(helm.template(values))["readinessProbe"]
    assert probe["grpc"] == {"port": 8081, "service": service}, "the router's listener, the engine's readiness"
    assert "httpGet" not in probe
    assert probe["periodSeconds"] == 5 and probe["failureThreshold"] == 3, "the same timing values"
    moved = {**values, "grpc": {"enabled": True, "port": 50051}}
    assert router(helm.template(moved))["readinessProbe"]["grpc"]["port"] == 50051
    whole = {**GRPC, "router": {"readinessProbe": {"protocol": "grpc", "grpcService": ""}}}
    assert router(helm.template(whole))["readinessProbe"]["grpc"] == {"port": 8081}, "'' is the server as a whole"
    named = {**GRPC, "router": {"readinessProbe": {"protocol": "grpc", "grpcService": "my.Service"}}}
    assert router(helm.template(named))["readinessProbe"]["grpc"]["service"] == "my.Service"


def test_readiness_stays_on_readyz_unless_asked(helm: Helm) -> None:
    probe = router(helm.template(GRPC))["readinessProbe"]
    assert probe["httpGet"] == {"path": "/readyz", "port": "admin"} and "grpc" not in probe
    custom = router(helm.template({**values_sets.GRPC_TRITON, "router": {"readinessProbe": {"protocol": "grpc"}}}))
    assert custom["readinessProbe"]["grpc"] == {"port": 8081}, "custom: no preset service name"


def test_inference_pool_targets_the_grpc_listener_over_h2c(helm: Helm) -> None:
    docs = helm.template(values_sets.GRPC_POOL)
    pool = one(docs, "InferencePool")
    crds.validate(pool)
    assert pool["spec"]["targetPorts"] == [{"number": container_port(router(docs), "grpc")}]
    assert pool["spec"]["targetPorts"] == [{"number": 50051}], "the router's gRPC port, never the model server's"
    assert pool["spec"]["appProtocol"] == "kubernetes.io/h2c"
    assert pool["spec"]["selector"]["matchLabels"] == model_deployment(docs)["spec"]["selector"]["matchLabels"]
    pool["spec"]["appProtocol"] = "grpc"  # the CRD knows http and kubernetes.io/h2c only
    with pytest.raises(jsonschema.ValidationError):
        crds.validate(pool)


def test_grpc_route_sends_to_the_services_grpc_port(helm: Helm) -> None:
    docs = helm.template(values_sets.GRPC_VLLM)
    route = one(docs, "GRPCRoute")
    crds.validate(route)
    assert route["spec"]["parentRefs"] == [{"name": "inference", "namespace": "gateways"}]
    assert route["spec"]["hostnames"] == ["grpc.example.com"]
    (rule,) = route["spec"]["rules"]
    assert rule["backendRefs"] == [{"name": FULLNAME, "port": service_port(docs, "grpc")["port"]}]
    assert rule["matches"] == [{"method": {"service": "vllm.grpc.engine.VllmEngine"}}]
    every = one(helm.template({**GRPC, "grpcRoute": {"enabled": True, "parentRefs": [{"name": "g"}]}}), "GRPCRoute")
    crds.validate(every)
    assert "matches" not in every["spec"]["rules"][0], "no methods: every gRPC request"
    assert "hostnames" not in every["spec"]


def test_grpc_route_can_send_to_the_pool(helm: Helm) -> None:
    route = one(helm.template(values_sets.GRPC_POOL), "GRPCRoute")
    crds.validate(route)
    (rule,) = route["spec"]["rules"]
    assert rule["backendRefs"] == [{"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": FULLNAME}]
    assert rule["matches"][0] == {"method": {"service": "sglang.grpc.scheduler.SglangScheduler", "method": "Generate"}}


def test_crd_validation_catches_a_wrong_grpc_route_field(helm: Helm) -> None:
    route = one(helm.template(values_sets.GRPC_VLLM), "GRPCRoute")
    route["spec"]["rules"][0]["matches"][0]["method"]["type"] = "Prefix"
    with pytest.raises(jsonschema.ValidationError):
        crds.validate(route)


def test_model_service_removes_the_grpc_route(helm: Helm) -> None:
    docs = helm.template(values_sets.GRPC_VLLM)
    ms = one(docs, "ModelService")
    crds.validate(ms)
    grpc_route = {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "GRPCRoute", "name": FULLNAME}
    assert ms["spec"]["route"] == grpc_route, "the only route: removed first, then the settle"
    assert [w["kind"] for w in ms["spec"]["workload"]] == ["Deployment", "Service"]
    route = one(docs, "GRPCRoute")
    assert route["metadata"]["labels"]["drainrouter.dev/service"] == ms["metadata"]["name"]
    assert route["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"

    both = one(helm.template({**values_sets.GRPC_TRITON, "modelService": {"enabled": True}}), "ModelService")
    assert both["spec"]["route"]["kind"] == "HTTPRoute", "one route gets the settle"
    assert both["spec"]["workload"][0] == grpc_route, "the GRPCRoute goes first after it"

    pool = one(helm.template(values_sets.GRPC_POOL), "ModelService")
    assert pool["spec"]["route"]["kind"] == "GRPCRoute"
    assert [w["kind"] for w in pool["spec"]["workload"]] == ["InferencePool", "Deployment", "Service"]


def test_network_policy_opens_the_grpc_port_like_the_http_port(helm: Helm) -> None:
    policy = one(helm.template(GRPC), "NetworkPolicy")
    assert _allowed(policy, {"app": "anyone"}, 8081)
    assert not _allowed(policy, {"app": "anyone"}, 8080), "vllm serves gRPC only: nothing behind the HTTP port"
    assert not _allowed(policy, {"app": "anyone"}, 8000), "the model server's own (gRPC) port stays closed"
    narrowed = one(helm.template(values_sets.GRPC_TRITON), "NetworkPolicy")
    assert _allowed(narrowed, {"app": "gateway"}, 8081) and not _allowed(narrowed, {"app": "other"}, 8081)
    assert _allowed(narrowed, {"app": "gateway"}, 8080), "custom (Triton) serves HTTP too"
    assert not _allowed(narrowed, {"app": "gateway"}, 8001)
    assert not _allowed(one(helm.template(), "NetworkPolicy"), {"app": "anyone"}, 8081), "closed when off"


def test_notes_show_the_grpc_path(helm: Helm) -> None:
    install = ["install", RELEASE, str(CHART), "--namespace", NAMESPACE, "--dry-run=client"]
    done = helm.run(*install, "--set", "grpc.enabled=true")
    assert done.returncode == 0, done.stderr
    notes = done.stdout.split("NOTES:", 1)[1]
    assert f"gRPC: Service {FULLNAME}:8081 (h2c) -> router :8081 -> vllm model server 127.0.0.1:8000" in notes
    assert "vllm serves gRPC only" in notes and 'pip install "vllm[grpc]"' in notes
    assert "Traffic: Service" not in notes, "no http Service port to show"
    assert "gRPC" not in helm.run(*install).stdout.split("NOTES:", 1)[1]
