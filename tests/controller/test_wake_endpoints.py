"""``wake_endpoints``: the activator's EndpointSlice and NetworkPolicy, rendered and read back; the
``--activator-service`` syntax; ``/admin/ports``. Pure tables."""

from __future__ import annotations

from typing import Any

import pytest

from drain_router.decisions import activation, ownership, service_ports, wake_endpoints
from tests import casefiles

OWNER = ownership.Owner(namespace="team-a", name="llama", uid="u-1")
HTTP = service_ports.Assignment("team-a", "llama", "http")
GRPC = service_ports.Assignment("team-a", "llama", "grpc")


def _service(*ports: dict[str, Any], name: str = "llama") -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "team-a"}, "spec": {"ports": list(ports)}}


def _slice(name: str, *endpoints: tuple[str, dict[str, Any]], ports: list[Any] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "endpoints": [{"addresses": [ip], "conditions": c} for ip, c in endpoints],
        "ports": ports or [],
    }


READY = {"ready": True, "serving": True, "terminating": False}


@pytest.mark.parametrize(
    ("port", "protocol"),
    [
        ({"name": "http", "port": 8080}, "http"),
        ({"name": "grpc", "port": 8081}, "grpc"),
        ({"name": "grpc-api", "port": 8081}, "grpc"),
        ({"name": "api", "port": 8081, "appProtocol": "kubernetes.io/h2c"}, "grpc"),
        ({"name": "grpcx", "port": 8081}, "http"),
        ({"port": 80}, "http"),
        ({"name": "ws", "appProtocol": "kubernetes.io/ws"}, "http"),
    ],
)
def test_a_ports_protocol(port: dict[str, Any], protocol: str) -> None:
    assert wake_endpoints.protocol_of(port) == protocol


def test_wanted_is_one_port_per_protocol_of_the_tcp_ports() -> None:
    services = [
        _service({"name": "http", "port": 8080}, {"name": "metrics", "port": 9090}),
        _service({"name": "grpc", "port": 8081}, {"name": "dns", "port": 53, "protocol": "UDP"}, name="llama-grpc"),
    ]
    assert wake_endpoints.wanted("team-a", "llama", services) == (GRPC, HTTP)
    assert wake_endpoints.wanted("team-a", "llama", [_service({"name": "dns", "protocol": "UDP"})]) == ()


@pytest.mark.parametrize(
    ("families", "addresses", "address_type", "endpoints"),
    [
        (None, ["10.0.0.7"], "IPv4", ["10.0.0.7"]),
        (["IPv4"], ["10.0.0.7", "fd00::7"], "IPv4", ["10.0.0.7"]),
        (["IPv6"], ["fd00::7"], "IPv6", ["fd00::7"]),
        (["IPv6", "IPv4"], ["10.0.0.7", "fd00::7"], "IPv6", ["fd00::7"]),
        # Pods of the other family only: no endpoint, so the service is never put to sleep.
        (["IPv4"], ["fd00::7"], "IPv4", []),
        (["IPv4"], ["not-an-ip"], "IPv4", []),
    ],
)
def test_the_slice_is_of_the_services_ip_family(
    families: list[str] | None, addresses: list[str], address_type: str, endpoints: list[str]
) -> None:
    service = _service({"name": "http", "port": 8080})
    if families is not None:
        service["spec"]["ipFamilies"] = families
    body = wake_endpoints.render_slice(
        owner=OWNER, api_version="drainrouter.dev/v1alpha1", service=service, assigned={"http": 20000},
        addresses=addresses,
    )  # fmt: skip
    assert body["addressType"] == address_type
    assert [e["addresses"][0] for e in body["endpoints"]] == endpoints
    assert wake_endpoints.classify(["llama"], [body]) is (
        activation.Endpoints.ACTIVATOR if endpoints else activation.Endpoints.PARTIAL
    )


def test_the_slice_names_the_service_the_activator_pods_and_the_assigned_ports() -> None:
    service = _service(
        {"name": "http", "port": 8080, "targetPort": "http"},
        {"name": "grpc", "port": 8081, "appProtocol": "kubernetes.io/h2c"},
        {"name": "dns", "port": 53, "protocol": "UDP"},
    )
    body = wake_endpoints.render_slice(
        owner=OWNER,
        api_version="drainrouter.dev/v1alpha1",
        service=service,
        assigned={"http": 20000, "grpc": 20001},
        addresses=["10.0.0.9", "10.0.0.7"],
    )
    assert body["metadata"] == {
        "name": "llama-drain-router",
        "namespace": "team-a",
        "labels": {
            "kubernetes.io/service-name": "llama",
            "endpointslice.kubernetes.io/managed-by": "drain-router.dev",
            "drainrouter.dev/service": "llama",
        },
        "ownerReferences": [
            {
                "apiVersion": "drainrouter.dev/v1alpha1",
                "kind": "ModelService",
                "name": "llama",
                "uid": "u-1",
                "controller": True,
                "blockOwnerDeletion": False,
            }
        ],
    }
    assert body["addressType"] == "IPv4"
    assert body["endpoints"] == [
        {"addresses": ["10.0.0.7"], "conditions": READY},
        {"addresses": ["10.0.0.9"], "conditions": READY},
    ]
    assert body["ports"] == [
        {"name": "http", "protocol": "TCP", "port": 20000},
        {"name": "grpc", "protocol": "TCP", "port": 20001, "appProtocol": "kubernetes.io/h2c"},
    ]
    claim = ownership.Claim(
        kind="EndpointSlice",
        namespace="team-a",
        name=body["metadata"]["name"],
        uid="s",
        labels=body["metadata"]["labels"],
    )
    assert isinstance(ownership.check(OWNER, claim), ownership.Consent), "the slice is the service's by the rule"


@pytest.mark.parametrize(
    ("services", "slices", "expected"),
    [
        pytest.param(["llama"], [], activation.Endpoints.NONE, id="no-slice"),
        pytest.param([], [], activation.Endpoints.NO_SERVICE, id="no-service"),
        pytest.param([], [_slice("llama-drain-router")], activation.Endpoints.PARTIAL, id="a-slice-of-a-gone-service"),
        pytest.param(
            ["llama"], [_slice("llama-drain-router", ("10.0.0.7", READY))], activation.Endpoints.ACTIVATOR, id="ready"
        ),
        pytest.param(
            ["llama"],
            [_slice("llama-drain-router", ("10.0.0.7", {"ready": False}))],
            activation.Endpoints.PARTIAL,
            id="not-ready",
        ),
        pytest.param(
            ["llama"],
            [_slice("llama-drain-router", ("10.0.0.7", {"ready": True, "terminating": True}))],
            activation.Endpoints.PARTIAL,
            id="terminating",
        ),
        pytest.param(
            ["llama"],
            [_slice("llama-drain-router", ("10.0.0.7", {}))],
            activation.Endpoints.ACTIVATOR,
            id="ready-unset",
        ),
        pytest.param(["llama"], [_slice("llama-drain-router")], activation.Endpoints.PARTIAL, id="no-endpoints"),
        pytest.param(
            ["llama", "llama-grpc"],
            [_slice("llama-drain-router", ("10.0.0.7", READY))],
            activation.Endpoints.PARTIAL,
            id="one-of-two-services",
        ),
        pytest.param(
            ["llama", "llama-grpc"],
            [_slice("llama-drain-router", ("10.0.0.7", READY)), _slice("llama-grpc-drain-router", ("10.0.0.7", READY))],
            activation.Endpoints.ACTIVATOR,
            id="both-services",
        ),
    ],
)
def test_classify(services: list[str], slices: list[dict[str, Any]], expected: activation.Endpoints) -> None:
    assert wake_endpoints.classify(services, slices) is expected


def test_in_step_compares_the_ready_endpoints_and_the_ports() -> None:
    ports = [{"name": "http", "port": 20000}]
    desired = _slice("s", ("10.0.0.7", READY), ("10.0.0.8", READY), ports=ports)
    assert wake_endpoints.in_step(_slice("s", ("10.0.0.8", READY), ("10.0.0.7", READY), ports=ports), desired)
    assert not wake_endpoints.in_step(_slice("s", ("10.0.0.7", READY), ports=ports), desired)
    assert not wake_endpoints.in_step(_slice("s", ("10.0.0.7", READY), ("10.0.0.8", READY), ports=[]), desired)
    assert not wake_endpoints.in_step(None, desired)


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({"ports": {"20000": "team-a/llama/http"}}, {20000: HTTP}),
        ({"ports": {}}, {}),
        ({"ports": {"20000": "team-a/llama/ftp"}}, None),
        ({"ports": {"x": "team-a/llama/http"}}, None),
        ({"ports": ["20000"]}, None),
        ([], None),
        (None, None),
    ],
)
def test_parse_listening_fails_closed(body: Any, expected: Any) -> None:
    assert wake_endpoints.parse_listening(body) == expected


@pytest.mark.parametrize(
    ("listening", "expected"),
    [
        ({20000: HTTP, 20001: GRPC, 20002: service_ports.Assignment("b", "c", "http")}, True),
        ({20000: HTTP}, False),
        ({20000: HTTP, 20001: service_ports.Assignment("b", "c", "grpc")}, False),
        (None, False),
    ],
)
def test_an_activator_pod_listens_on_every_port_of_the_service(listening: Any, expected: bool) -> None:
    assert wake_endpoints.listens(listening, {20000: HTTP, 20001: GRPC}) is expected
    assert not wake_endpoints.listens(listening, {}), "a service with no port is nobody's endpoint"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("gw/activator", ("gw", "activator", None)),
        (" gw/activator ", ("gw", "activator", None)),
        ("gw/activator:8080", ("gw", "activator", ":8080")),
        ("gw/activator:8080,8081", ("gw", "activator", ":8080,8081")),
    ],
)
def test_activator_service_accepts_the_old_port_suffix_and_ignores_it(text: str, expected: tuple[Any, ...]) -> None:
    parsed = wake_endpoints.parse_activator_service(text)
    assert (parsed.namespace, parsed.name, parsed.ignored_suffix) == expected
    assert parsed.configmap == "activator-ports"


@pytest.mark.parametrize("text", ["activator", "gw/", "GW/activator", "gw/activator:", "gw/activator:http", "a/b/c"])
def test_activator_service_refuses_anything_else(text: str) -> None:
    with pytest.raises(ValueError, match="is not <namespace>/<name>"):
        wake_endpoints.parse_activator_service(text)


def test_policy_names_fit_and_stay_distinct() -> None:
    assert wake_endpoints.policy_name("team-a", "llama") == "drain-router-team-a-llama"
    long_a = wake_endpoints.policy_name("n" * 40, "s" * 40 + "a")
    long_b = wake_endpoints.policy_name("n" * 40, "s" * 40 + "b")
    assert len(long_a) <= 63 and len(long_b) <= 63 and long_a != long_b


@pytest.mark.parametrize("row", casefiles.params(casefiles.load("wake_endpoints/peers.yaml")))
def test_translate_peers(row: dict[str, Any]) -> None:
    labels = row.get("podLabels", {"app": "llama"})
    targets = frozenset(row["targets"]) if "targets" in row else None
    assert wake_endpoints.translate_peers(row["policies"], "team-a", labels, targets) == row["expect"]


@pytest.mark.parametrize(
    ("peers", "ingress"),
    [
        (None, [{"ports": [{"protocol": "TCP", "port": 20000}, {"protocol": "TCP", "port": 20001}]}]),
        (
            [{"ipBlock": {"cidr": "10.0.0.0/8"}}],
            [
                {
                    "ports": [{"protocol": "TCP", "port": 20000}, {"protocol": "TCP", "port": 20001}],
                    "from": [{"ipBlock": {"cidr": "10.0.0.0/8"}}],
                }
            ],
        ),
        ([], []),
    ],
)
def test_the_policy_admits_the_peers_to_the_services_ports_only(peers: Any, ingress: list[Any]) -> None:
    activator = wake_endpoints.ActivatorService(namespace="gw", name="activator")
    body = wake_endpoints.render_policy(
        activator=activator,
        activator_selector={"app": "activator"},
        owner=OWNER,
        peers=peers,
        ports=[20001, 20000],
    )
    assert body["metadata"]["name"] == "drain-router-team-a-llama" and body["metadata"]["namespace"] == "gw"
    assert body["spec"] == {
        "podSelector": {"matchLabels": {"app": "activator"}},
        "policyTypes": ["Ingress"],
        "ingress": ingress,
    }


@pytest.mark.parametrize(
    ("services", "spec", "targets"),
    [
        ([{"spec": {"ports": [{"name": "http", "port": 80, "targetPort": "http"}]}}], {}, {8080, "http"}),
        (
            [
                {
                    "spec": {
                        "ports": [{"port": 80, "targetPort": 8181}, {"name": "grpc", "port": 81, "targetPort": "grpc"}]
                    }
                }
            ],
            {"router": {"port": 8181, "grpcPort": 9000}},
            {8181, 9000, "grpc"},
        ),
        (
            [{"spec": {"ports": [{"port": 80}, {"port": 53, "protocol": "UDP"}]}}],
            {"router": {"port": 8080}},
            {8080, 80},
        ),
    ],
    ids=["a-named-target-stands-for-the-router-port", "numbers-names-and-the-grpc-port", "no-target-is-the-port"],
)
def test_target_ports(services: list[Any], spec: dict[str, Any], targets: set[Any]) -> None:
    """What the model's policies must admit a client to, for the activator to admit it: the Services'
    target ports as written, and the router's ports by number (a named target stands for one)."""
    assert wake_endpoints.target_ports(services, spec) == frozenset(targets)


def test_a_policy_naming_the_router_port_by_number_covers_a_service_naming_it() -> None:
    """The model chart's case: the Service targets ``http``, the model's policy admits on 8080."""
    policy = {
        "spec": {
            "podSelector": {},
            "ingress": [
                {"ports": [{"port": 8080}], "from": [{"ipBlock": {"cidr": "10.0.0.0/8"}}]},
                {"ports": [{"port": 9091}], "from": [{"ipBlock": {"cidr": "10.9.0.0/16"}}]},
            ],
        }
    }
    services = [{"spec": {"ports": [{"name": "http", "port": 80, "targetPort": "http"}]}}]
    targets = wake_endpoints.target_ports(services, {"router": {"port": 8080}})
    assert wake_endpoints.translate_peers([policy], "team-a", {}, targets) == [{"ipBlock": {"cidr": "10.0.0.0/8"}}]
