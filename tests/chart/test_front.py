"""The front in the model chart (front.enabled): its Deployment with the flags `drain-router front`
takes (--continuation from the engine preset unless set), its Service as the HTTPRoute's backend,
RBAC that is exactly its three calls, the NetworkPolicies (the front admits what trafficFrom admits,
the model pods admit the front), and the checks that refuse what cannot work. Off by default:
nothing of it is rendered. (Every object of the front value set is validated against the Kubernetes
schemas and the restricted Pod Security Standard with the other value sets.)"""

from __future__ import annotations

from typing import Any

import pytest

from tests.chart import netpol, values_sets
from tests.chart.helm import (
    NAMESPACE,
    RELEASE,
    Helm,
    component,
    containers,
    find,
    flag,
    model_deployment,
    model_service,
    one,
)

FULLNAME = f"{RELEASE}-drain-router"
FRONT_NAME = f"{FULLNAME}-front"
#: The smallest values that render the front: it needs its ModelService.
ENABLED: dict[str, Any] = {"front": {"enabled": True}, "modelService": {"enabled": True}}
ROUTED: dict[str, Any] = {**ENABLED, "httpRoute": {"enabled": True, "parentRefs": [{"name": "inference"}]}}
GATEWAYS = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "gateways"}}}

#: (apiGroups, resources, resourceNames, verbs): the front's Role, all of it.
FRONT_RULES: list[tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...], tuple[str, ...]]] = [
    (("discovery.k8s.io",), ("endpointslices",), (), ("list",)),
    (("drainrouter.dev",), ("modelservices",), (FULLNAME,), ("get",)),
    (("drainrouter.dev",), ("modelservices/status",), (FULLNAME,), ("patch",)),
]

#: The engine presets' continuation dialect (front.continuation null).
PRESET_CONTINUATION = {
    "vllm": "token-ids",
    "sglang": "chat",
    "tgi": "completions",
    "llamacpp": "completions",
    "custom": "completions",
}


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def front_deployment(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return one(docs, "Deployment", FRONT_NAME)


def front_container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (container,) = front_deployment(docs)["spec"]["template"]["spec"]["containers"]
    assert container["name"] == "front"
    return container


def front_args(docs: list[dict[str, Any]]) -> list[str]:
    return front_container(docs)["args"]


def _pod(deployment: dict[str, Any]) -> netpol.Pod:
    return netpol.Pod.of(deployment, NAMESPACE)


def test_off_by_default_renders_nothing_of_it(helm: Helm) -> None:
    for values in ({}, values_sets.FULL):
        docs = helm.template(values)
        assert not [d for d in docs if d["metadata"]["name"].startswith(FRONT_NAME)]
        assert not [d for d in docs if component(d) == "front"]
        policy = one(docs, "NetworkPolicy", FULLNAME)
        assert "front" not in str(policy["spec"]), "no rule for front pods that do not exist"
    (rule,) = one(helm.template(values_sets.FULL), "HTTPRoute")["spec"]["rules"]
    assert rule["backendRefs"] == [{"name": FULLNAME, "port": 80}], "the route goes to the model's Service"


def test_the_default_front_runs_these_flags(helm: Helm) -> None:
    """The whole command line of the defaults (vLLM: token-ids), in the order rendered."""
    assert front_args(helm.template(ENABLED)) == [
        "front",
        "--service",
        f"{NAMESPACE}/{FULLNAME}",
        "--continuation",
        "token-ids",
        "--max-continuations",
        "3",
        "--port",
        "8080",
        "--admin-port",
        "9091",
        "--shutdown-drain-secs",
        "30",
        "--termination-grace-secs",
        "3600",
        "--queue-size",
        "256",
        "--log-format",
        "json",
        "--log-level",
        "info",
    ]


@pytest.mark.parametrize(("engine", "dialect"), list(PRESET_CONTINUATION.items()))
def test_continuation_follows_the_engine_preset(helm: Helm, engine: str, dialect: str) -> None:
    values = _merge(ENABLED, {"modelServer": {"engine": engine}})
    if engine == "custom":
        values = _merge(values, values_sets.CUSTOM_SERVER)
    assert flag(front_args(helm.template(values)), "--continuation") == dialect


@pytest.mark.parametrize(
    ("value", "dialect"),
    [("off", "off"), (False, "off"), ("completions", "completions"), ("chat", "chat"), ("token-ids", "token-ids")],
    ids=["off", "bare-off", "completions", "chat", "token-ids"],
)
def test_continuation_set_wins_over_the_preset(helm: Helm, value: str | bool, dialect: str) -> None:
    """A bare ``off`` in a values file is YAML's false: it means off too (quoted in the pod spec)."""
    values = _merge(ENABLED, {"front": {"continuation": value, "maxContinuations": 0}})
    args = front_args(helm.template(values))
    assert flag(args, "--continuation") == dialect
    assert flag(args, "--max-continuations") == "0"


def test_the_modelservice_named_is_the_one_rendered(helm: Helm) -> None:
    values = _merge(ENABLED, {"modelService": {"name": "llama-70b"}})
    docs = helm.template(values, namespace="serving")
    assert flag(front_args(docs), "--service") == "serving/llama-70b"
    assert one(docs, "ModelService")["metadata"]["name"] == "llama-70b"
    role = one(docs, "Role", FRONT_NAME)
    assert {name for rule in role["rules"] for name in rule.get("resourceNames", [])} == {"llama-70b"}


def test_the_holding_queue_always_and_the_limit_only_when_set(helm: Helm) -> None:
    """The queue holds requests while no model pod is ready, limit or not."""
    args = front_args(helm.template(ENABLED))
    assert flag(args, "--max-concurrent-requests") is None and flag(args, "--queue-timeout-secs") is None
    assert flag(args, "--queue-size") == "256"
    args = front_args(helm.template(values_sets.FRONT))
    assert flag(args, "--max-concurrent-requests") == "512"
    assert flag(args, "--queue-size") == "1024"
    assert flag(args, "--queue-timeout-secs") == "20"
    untimed = _merge(ENABLED, {"front": {"admission": {"maxConcurrentRequests": 64}}})
    args = front_args(helm.template(untimed))
    assert flag(args, "--max-concurrent-requests") == "64" and flag(args, "--queue-size") == "256"
    assert flag(args, "--queue-timeout-secs") is None, "null: the front's own default"


def test_tracing_follows_the_routers(helm: Helm) -> None:
    docs = helm.template(values_sets.FRONT)
    container = front_container(docs)
    assert "--tracing" in container["args"]
    router = containers(docs)["router"]
    otel = [e for e in router["env"] if e["name"].startswith("OTEL_")]
    assert otel and [e for e in container["env"] if e["name"].startswith("OTEL_")] == otel
    quiet = front_container(helm.template(ENABLED))
    assert "--tracing" not in quiet["args"] and "env" not in quiet


def test_one_grace_value_probes_on_the_admin_port_and_no_prestop(helm: Helm) -> None:
    values = _merge(ENABLED, {"front": {"terminationGracePeriodSeconds": 5400, "shutdownDrainSecs": 45}})
    docs = helm.template(values)
    pod = front_deployment(docs)["spec"]["template"]["spec"]
    container = front_container(docs)
    assert pod["terminationGracePeriodSeconds"] == 5400
    assert flag(container["args"], "--termination-grace-secs") == "5400"
    assert flag(container["args"], "--shutdown-drain-secs") == "45"
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"http": 8080, "admin": 9091}
    assert flag(container["args"], "--admin-port") == str(ports["admin"])
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "admin"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/livez", "port": "admin"}
    assert "lifecycle" not in container, "SIGTERM at once: the front drains itself"
    assert pod["serviceAccountName"] == FRONT_NAME and pod["automountServiceAccountToken"] is True


def test_the_front_pod_is_as_strict_as_the_router(helm: Helm) -> None:
    docs = helm.template(ENABLED)
    pod = front_deployment(docs)["spec"]["template"]["spec"]
    assert pod["securityContext"] == {"seccompProfile": {"type": "RuntimeDefault"}}
    assert front_container(docs)["securityContext"] == containers(docs)["router"]["securityContext"]
    assert front_container(docs)["image"] == containers(docs)["router"]["image"], "the router's image"


def test_rbac_is_exactly_the_fronts_three_calls(helm: Helm) -> None:
    """EndpointSlices read and watched in the namespace, its ModelService read by name, that
    ModelService's status patched (the wake): no other verb, resource or object."""
    docs = helm.template(ENABLED)
    role = one(docs, "Role", FRONT_NAME)
    assert role["metadata"]["namespace"] == NAMESPACE
    found = []
    for rule in role["rules"]:
        assert set(rule) <= {"apiGroups", "resources", "resourceNames", "verbs"}, rule
        found.append(
            (
                tuple(rule["apiGroups"]),
                tuple(rule["resources"]),
                tuple(rule.get("resourceNames", ())),
                tuple(rule["verbs"]),
            )
        )
    assert found == FRONT_RULES
    (binding,) = find(docs, "RoleBinding")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": FRONT_NAME}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": FRONT_NAME, "namespace": NAMESPACE}]
    assert one(docs, "ServiceAccount", FRONT_NAME)
    assert not find(docs, "ClusterRole") and not find(docs, "ClusterRoleBinding")
    assert [r["metadata"]["name"] for r in find(docs, "Role")] == [FRONT_NAME], "the chart's only Role"


def test_the_http_route_goes_to_the_front_which_serves_on_its_port(helm: Helm) -> None:
    docs = helm.template(ROUTED)
    (rule,) = one(docs, "HTTPRoute")["spec"]["rules"]
    assert rule["backendRefs"] == [{"name": FRONT_NAME, "port": 80}]
    service = one(docs, "Service", FRONT_NAME)
    (port,) = service["spec"]["ports"]
    assert port == {"name": "http", "port": 80, "targetPort": "http", "protocol": "TCP"}
    front_labels = front_deployment(docs)["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= front_labels.items()
    model_labels = model_deployment(docs)["spec"]["template"]["metadata"]["labels"]
    assert not service["spec"]["selector"].items() <= model_labels.items(), "never the model pods"
    assert model_service(docs)["metadata"]["name"] == FULLNAME, "the model's Service stays (its EndpointSlices)"
    # The ModelService still tears down the route first; the front is not part of its workload.
    ms = one(docs, "ModelService")
    assert ms["spec"]["route"] == {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute", "name": FULLNAME}
    assert FRONT_NAME not in {w["name"] for w in ms["spec"]["workload"]}


def test_a_grpc_route_stays_on_the_models_service(helm: Helm) -> None:
    """Triton serves HTTP and gRPC side by side: HTTP through the front, gRPC straight to the routers."""
    values = _merge(values_sets.GRPC_TRITON, {**ENABLED, "grpcRoute": {"enabled": True}})
    docs = helm.template(values)
    (http,) = one(docs, "HTTPRoute")["spec"]["rules"]
    assert http["backendRefs"] == [{"name": FRONT_NAME, "port": 80}]
    (grpc,) = one(docs, "GRPCRoute")["spec"]["rules"]
    assert grpc["backendRefs"] == [{"name": FULLNAME, "port": 8081}]


def _sources() -> list[netpol.Pod]:
    """Pods that may try the front's and the routers' traffic ports."""
    return [
        netpol.Pod(namespace="gateways", labels={"app": "gateway"}),
        netpol.Pod(namespace=NAMESPACE, labels={"app": "client"}),
        netpol.Pod(namespace="elsewhere", labels={"app": "client"}),
        netpol.Pod(
            namespace="drain-router-system",
            labels={"app.kubernetes.io/name": "drain-router-controller", "app.kubernetes.io/component": "activator"},
        ),
    ]


@pytest.mark.parametrize(
    "traffic_from",
    [
        pytest.param([], id="anyone"),
        pytest.param([GATEWAYS], id="gateways-namespace"),
        pytest.param([{"podSelector": {"matchLabels": {"app": "client"}}}], id="pods-of-the-namespace"),
    ],
)
def test_the_front_admits_what_traffic_from_admits(helm: Helm, traffic_from: list[dict[str, Any]]) -> None:
    """For each source pod, the front's traffic port admits it exactly when the routers' traffic
    port admits it in the same release without the front and without the activator's peer: the
    same trafficFrom, rendered alike."""
    network = {"trafficFrom": traffic_from, "activator": {"enabled": False}}
    docs = helm.template(_merge(ENABLED, {"networkPolicy": network}))
    reference = helm.template({"networkPolicy": network})
    front = _pod(front_deployment(docs))
    model = _pod(model_deployment(reference))
    for source in _sources():
        expected = netpol.ingress_allowed(reference, source, model, 8080)
        assert netpol.ingress_allowed(docs, source, front, 8080) == expected, source
        assert not netpol.ingress_allowed(docs, source, front, 9091), "the admin port: adminFrom only (none here)"
    if traffic_from:
        assert not netpol.ingress_allowed(docs, _sources()[2], front, 8080), "a restriction restricts"


def test_the_model_pods_admit_the_front_on_the_traffic_port_only(helm: Helm) -> None:
    docs = helm.template(values_sets.FRONT)
    front = _pod(front_deployment(docs))
    model = _pod(model_deployment(docs))
    assert netpol.ingress_allowed(docs, front, model, 8080), "the front reaches the routers"
    assert not netpol.ingress_allowed(docs, front, model, 9091), "not their admin port"
    assert not netpol.ingress_allowed(docs, front, model, 30000), "nor the model server"
    elsewhere = netpol.Pod(namespace="elsewhere", labels=front.labels)
    assert not netpol.ingress_allowed(docs, elsewhere, model, 8080), "the front's labels in another namespace"
    gateway = netpol.Pod(namespace="gateways", labels={"app": "gateway"})
    assert netpol.ingress_allowed(docs, gateway, front, 8080)
    assert netpol.ingress_allowed(docs, gateway, model, 8080), "trafficFrom still reaches the routers"
    monitoring = netpol.Pod(namespace="monitoring", labels={"app": "prometheus"})
    assert netpol.ingress_allowed(docs, monitoring, front, 9091), "adminFrom scrapes the front"
    assert not netpol.ingress_allowed(docs, gateway, front, 9091)
    # The front's rule on the model's policy is one the controller translates for a sleeping
    # service: a rule on the router's traffic port, its peer a podSelector of this namespace.
    policy = one(docs, "NetworkPolicy", FULLNAME)
    front_rules = [r for r in policy["spec"]["ingress"] if any("front" in str(p) for p in r.get("from", []))]
    assert front_rules == [
        {
            "ports": [{"port": 8080, "protocol": "TCP"}],
            "from": [{"podSelector": {"matchLabels": front_deployment(docs)["spec"]["selector"]["matchLabels"]}}],
        }
    ]


def test_without_network_policy_no_front_policy(helm: Helm) -> None:
    docs = helm.template(_merge(ENABLED, {"networkPolicy": {"enabled": False}}))
    assert not find(docs, "NetworkPolicy")
    assert front_deployment(docs)


def test_scraped_by_its_own_pod_monitor(helm: Helm) -> None:
    docs = helm.template(values_sets.FRONT)
    monitor = one(docs, "PodMonitor", FRONT_NAME)
    assert monitor["spec"]["selector"]["matchLabels"] == front_deployment(docs)["spec"]["selector"]["matchLabels"]
    assert monitor["spec"]["podMetricsEndpoints"] == [{"port": "admin", "path": "/metrics", "interval": "15s"}]
    model_monitor = one(docs, "PodMonitor", FULLNAME)
    assert model_monitor["spec"]["selector"]["matchLabels"] == model_deployment(docs)["spec"]["selector"]["matchLabels"]
    assert not find(helm.template(ENABLED), "PodMonitor")


@pytest.mark.parametrize(
    ("front", "pdb", "budget"),
    [({"replicas": 2}, {}, True), ({"replicas": 1}, {}, False), ({"replicas": 3}, {"enabled": False}, False)],
    ids=["two", "one", "pdb-off"],
)
def test_a_disruption_budget_with_two_replicas_or_more(
    helm: Helm, front: dict[str, Any], pdb: dict[str, Any], budget: bool
) -> None:
    docs = helm.template(_merge(ENABLED, {"front": front, "pdb": pdb}))
    found = find(docs, "PodDisruptionBudget", FRONT_NAME)
    assert len(found) == int(budget)
    if budget:
        assert found[0]["spec"]["maxUnavailable"] == 1
        assert found[0]["spec"]["selector"] == front_deployment(docs)["spec"]["selector"]
    assert front_deployment(docs)["spec"]["replicas"] == front["replicas"]


def test_pod_escape_hatches_land_on_the_front_pod(helm: Helm) -> None:
    docs = helm.template(values_sets.FRONT)
    template = front_deployment(docs)["spec"]["template"]
    assert template["metadata"]["annotations"] == {"example.com/cost-center": "llm"}
    assert template["spec"]["nodeSelector"] == {"node-role.example.com/edge": "true"}
    assert "podAntiAffinity" in template["spec"]["affinity"], "spread over nodes with several replicas"
    assert "example.com/cost-center" not in model_deployment(docs)["spec"]["template"]["metadata"]["annotations"]


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        pytest.param({"front": {"continuation": "bogus"}}, "/front/continuation", id="continuation"),
        pytest.param({"front": {"maxContinuations": -1}}, "/front/maxContinuations", id="negative-continuations"),
        pytest.param({"front": {"port": 0}}, "/front/port", id="port-zero"),
        pytest.param({"front": {"terminationGracePeriodSeconds": "3600"}}, "terminationGracePeriodSeconds", id="str"),
        pytest.param({"front": {"shutdownDrainSecs": 1801}}, "/front/shutdownDrainSecs", id="drain-ceiling"),
        pytest.param({"front": {"enabeld": True}}, "enabeld", id="typo-key"),
        pytest.param({"front": {"admission": {"queueSize": -1}}}, "queueSize", id="negative-queue"),
    ],
)
def test_schema_rejects(helm: Helm, values: dict[str, Any], expected: str) -> None:
    error = helm.template_error(_merge(ENABLED, values))
    assert "schema" in error
    assert expected in error


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        pytest.param({"front": {"enabled": True}}, "front.enabled needs modelService.enabled", id="no-modelservice"),
        pytest.param(
            {**values_sets.INFERENCE_POOL, **ENABLED},
            "front.enabled with inferencePool.enabled",
            id="inference-pool",
        ),
        pytest.param({**ENABLED, "grpc": {"enabled": True}}, "vllm serves gRPC only", id="grpc-only-engine"),
        pytest.param(_merge(ENABLED, {"front": {"adminPort": 8080}}), "front.port and front.adminPort", id="ports"),
        pytest.param(
            _merge(ENABLED, {"front": {"shutdownDrainSecs": 60, "terminationGracePeriodSeconds": 60}}),
            "front.shutdownDrainSecs (60) must be below",
            id="drain-eats-grace",
        ),
        pytest.param(
            _merge(ENABLED, {"front": {"shutdownDrainSecs": 15}}),
            "above the front's readiness probe window",
            id="drain-inside-probe-window",
        ),
    ],
)
def test_render_checks_refuse(helm: Helm, values: dict[str, Any], expected: str) -> None:
    assert expected in helm.template_error(values)


@pytest.mark.parametrize(
    ("front", "accepted"),
    [({"shutdownDrainSecs": 16}, True), ({"shutdownDrainSecs": 0}, True), ({"shutdownDrainSecs": 15}, False)],
    ids=["above-window", "no-drain", "at-window"],
)
def test_drain_edges(helm: Helm, front: dict[str, Any], accepted: bool) -> None:
    values = _merge(ENABLED, {"front": front})
    if accepted:
        assert flag(front_args(helm.template(values)), "--shutdown-drain-secs") == str(front["shutdownDrainSecs"])
    else:
        helm.template_error(values)


def test_notes_show_the_front(helm: Helm) -> None:
    done = helm.run(
        "install",
        RELEASE,
        str(values_sets.VALUES.parent),
        "--namespace",
        NAMESPACE,
        "--dry-run=client",
        "--set",
        "front.enabled=true",
        "--set",
        "modelService.enabled=true",
        "--set",
        "modelServer.engine=sglang",
    )
    assert done.returncode == 0, done.stderr
    notes = done.stdout.split("NOTES:", 1)[1]
    assert f"Front: Service {FRONT_NAME}:80 -> front :8080 (2 pods)" in notes
    assert "--continuation chat, at most 3 per request" in notes
    assert "not part of that teardown" in notes


def test_a_front_of_its_own_per_release(helm: Helm) -> None:
    """Two releases in one namespace: neither's Service nor model policy selects the other's front."""
    first = helm.template(ENABLED, release="llama")
    second = helm.template(ENABLED, release="qwen")
    first_front = one(first, "Deployment", "llama-drain-router-front")["spec"]["template"]["metadata"]["labels"]
    second_front = one(second, "Deployment", "qwen-drain-router-front")["spec"]["template"]["metadata"]["labels"]
    selector = {"matchLabels": one(second, "Service", "qwen-drain-router-front")["spec"]["selector"]}
    assert netpol.selects(selector, second_front) and not netpol.selects(selector, first_front)
    policy = one(second, "NetworkPolicy", "qwen-drain-router")
    (rule,) = [r for r in policy["spec"]["ingress"] if "front" in str(r.get("from"))]
    (peer,) = rule["from"]
    assert netpol.selects(peer["podSelector"], second_front) and not netpol.selects(peer["podSelector"], first_front)


@pytest.mark.parametrize(
    "over",
    [
        {},
        {"modelServer": {"engine": "sglang"}},
        {"modelServer": {"engine": "llamacpp"}},
        {"front": {"admission": {"maxConcurrentRequests": 64, "queueSize": 32, "queueTimeoutSecs": 20}}},
        {"front": {"continuation": False}},
    ],
    ids=["defaults", "sglang", "llamacpp", "admission", "off"],
)
def test_the_rendered_command_line_is_one_the_front_takes(helm: Helm, over: dict[str, Any], monkeypatch) -> None:
    """The chart's args run through the real ``drain-router front`` command line (its process stubbed):
    every flag exists and every value passes its checks."""
    from click.testing import CliRunner

    from drain_router import cli, early_signals
    from drain_router.front import process

    seen: list[Any] = []
    monkeypatch.setattr(process, "serve", lambda cfg, settings, **kw: seen.append((cfg, settings)) or 0)
    monkeypatch.setattr(early_signals, "install", lambda: None)
    monkeypatch.setattr("drain_router.logs.configure", lambda **kw: None)
    args = front_args(helm.template(_merge(ENABLED, over)))
    result = CliRunner().invoke(cli.main, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    [(_, settings)] = seen
    assert settings.service == f"{NAMESPACE}/{FULLNAME}"
    assert settings.continuation == flag(args, "--continuation")
