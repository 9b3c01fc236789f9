"""``activator.plan_listeners``, ``configmap_ref``, ``should_request_wake`` and ``wake_patch``: which
ports the activator listens on, and how it asks for a wake."""

from __future__ import annotations

import pytest

from drain_router.decisions import activator, durations
from drain_router.decisions.activation import ActivationStatus, Phase
from drain_router.decisions.service_ports import Assignment

T0 = durations.parse_time("2025-01-01T00:00:00Z")


A, B = Assignment("team-a", "llama", "http"), Assignment("team-b", "other", "http")
A_GRPC = Assignment("team-a", "llama", "grpc")


@pytest.mark.parametrize(
    ("table", "listening", "max_services", "plan"),
    [
        pytest.param({20000: A, 20001: A_GRPC}, {}, 1, ((), ((20000, A), (20001, A_GRPC)), ()), id="a-service-whole"),
        pytest.param({20000: A, 20001: B}, {}, 1, ((), ((20000, A),), (B,)), id="past-max-by-port"),
        pytest.param({20000: B, 20001: A}, {20001: A}, 1, ((), (), (B,)), id="the-listened-one-keeps-its-place"),
        pytest.param({20001: A}, {20000: B, 20001: A}, 5, ((20000,), (), ()), id="a-port-leaves"),
        pytest.param({20000: A}, {20000: B}, 5, ((20000,), ((20000, A),), ()), id="a-port-changes-hands"),
        pytest.param({20000: A_GRPC}, {20000: A}, 5, ((20000,), ((20000, A_GRPC),), ()), id="a-protocol-changes"),
        pytest.param({}, {}, 5, ((), (), ()), id="nothing"),
    ],
)
def test_plan_listeners(table, listening, max_services, plan) -> None:
    got = activator.plan_listeners(table, listening, max_services)
    assert (got.close, got.open, got.over) == plan


@pytest.mark.parametrize(
    ("text", "namespace", "ref"),
    [
        ("drain-router/activator-ports", None, ("drain-router", "activator-ports")),
        ("activator-ports", "ns", ("ns", "activator-ports")),
        ("other/activator-ports", "ns", ("other", "activator-ports")),
        ("activator-ports", None, None),  # out of cluster: a namespace must be given
        ("a/b/c", "ns", None),
        ("Drain/x", "ns", None),
        ("", "ns", None),
    ],
)
def test_configmap_ref(text: str, namespace: str | None, ref: tuple[str, str] | None) -> None:
    if ref is None:
        with pytest.raises(ValueError, match="NAMESPACE/NAME"):
            activator.configmap_ref(text, namespace)
    else:
        assert activator.configmap_ref(text, namespace) == ref


@pytest.mark.parametrize(
    ("status", "ask"),
    [
        (ActivationStatus(phase=Phase.SCALED_TO_ZERO), True),
        (ActivationStatus(phase=Phase.SCALED_TO_ZERO, wake_requested_at=T0), False),  # pending: once
        (ActivationStatus(phase=Phase.WAKING, wake_requested_at=T0), False),
        (ActivationStatus(phase=Phase.SCALED_TO_ZERO, wake_requested_at=T0, awoken_at=T0 + 5), True),  # stale
        (ActivationStatus(phase=Phase.ACTIVE, wake_requested_at=T0, awoken_at=T0 + 5), True),  # between steps
    ],
)
def test_a_wake_is_asked_for_once_while_pending(status: ActivationStatus, ask: bool) -> None:
    assert activator.should_request_wake(status, held=1) is ask
    assert activator.should_request_wake(status, held=0) is False  # nothing held: no wake


def test_the_wake_patch_carries_its_precondition() -> None:
    assert activator.wake_patch(T0 + 1.5, "42") == {
        "metadata": {"resourceVersion": "42"},
        "status": {"lifecycle": {"wakeRequestedAt": durations.format_time(T0 + 1.5)}},
    }


def test_the_activation_status_is_read_from_the_lifecycle() -> None:
    status = {
        "lifecycle": {
            "phase": "Waking",
            "replicasBeforeZero": 2,
            "wakeRequestedAt": "2025-01-01T00:00:00Z",
            "awokenAt": "2024-12-31T00:00:00Z",
            "coldStartSeconds": 41.5,
        }
    }
    assert activator.activation_status(status) == ActivationStatus(
        phase=Phase.WAKING,
        replicas_before_zero=2,
        wake_requested_at=T0,
        awoken_at=T0 - 86400,
        cold_start_seconds=41.5,
    )
    assert activator.activation_status(status).wake_pending


@pytest.mark.parametrize(
    "status",
    [None, {}, {"lifecycle": None}, {"lifecycle": {"phase": "Asleep", "wakeRequestedAt": "yesterday"}}],
)
def test_a_missing_or_malformed_lifecycle_reads_as_no_wake_pending(status: object) -> None:
    read = activator.activation_status(status)
    assert read == ActivationStatus() and activator.should_request_wake(read, held=1)


def test_the_pods_are_listed_by_match_labels_and_probed_on_the_router_ports() -> None:
    spec = {"podSelector": {"matchLabels": {"tier": "model", "app": "llama"}}, "router": {"port": 8000}}
    assert activator.label_selector(spec) == "app=llama,tier=model"
    assert activator.label_selector({"podSelector": {"matchExpressions": []}}) is None
    assert activator.router_port(spec) == 8000
    assert activator.router_port({"router": {"port": True, "adminPort": 9091}}) == activator.DEFAULT_ROUTER_PORT
    assert activator.router_port({"router": {"port": 70000}}) == activator.DEFAULT_ROUTER_PORT == 8080


@pytest.mark.parametrize(
    ("spec", "port"),
    [
        ({"router": {"port": 8080, "grpcPort": 8081}}, 8081),
        ({"router": {"port": 8080}}, None),
        ({"router": {"grpcPort": 0}}, None),
        ({"router": {"grpcPort": 70000}}, None),
        ({"router": {"grpcPort": "8081"}}, None),
        ({"router": {"grpcPort": True}}, None),
        ({}, None),
        (None, None),
    ],
)
def test_the_router_grpc_port_is_spec_router_grpc_port_or_none(spec: object, port: int | None) -> None:
    """A service with no valid grpcPort takes no gRPC calls (the activator answers them UNAVAILABLE)."""
    assert activator.router_grpc_port(spec) == port


def test_candidate_pods_are_running_with_an_ip_and_not_deleted_oldest_first() -> None:
    def pod(name: str, created: str, *, phase: str = "Running", ip: str | None = "10.0.0.1", deleted: bool = False):
        meta = {"name": name, "creationTimestamp": created} | ({"deletionTimestamp": created} if deleted else {})
        return {"metadata": meta, "status": {"phase": phase} | ({"podIP": ip} if ip else {})}

    pods = {
        "items": [
            pod("young", "2025-01-02T00:00:00Z", ip="10.0.0.2"),
            pod("old", "2025-01-01T00:00:00Z", ip="10.0.0.1"),
            pod("pending", "2024-01-01T00:00:00Z", phase="Pending", ip="10.0.0.3"),
            pod("no-ip", "2024-01-01T00:00:00Z", ip=None),
            pod("going", "2024-01-01T00:00:00Z", ip="10.0.0.4", deleted=True),
        ]
    }
    assert activator.candidate_pods(pods) == ["10.0.0.1", "10.0.0.2"]
    assert activator.candidate_pods({}) == []
