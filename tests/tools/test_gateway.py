"""The e2e gateway's decisions (e2e/kubernetes/gateway.py): which endpoints a route reaches, how
servers keep their slots, which runtime commands move HAProxy from one state to the next."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from e2e.kubernetes.gateway import SLOTS, Backend, assign, backends, commands, endpoints, granted, render, structure


def service(name: str, ns: str = "team-a", ports: tuple[tuple[str, int], ...] = (("http", 80),)) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": ns}, "spec": {"ports": [{"name": n, "port": p} for n, p in ports]}}


def endpoint_slice(
    svc: str, endpoints_: list[tuple[str, bool, bool]], ns: str = "team-a", port: int = 8080
) -> dict[str, Any]:
    return {
        "metadata": {"name": f"{svc}-x", "namespace": ns, "labels": {"kubernetes.io/service-name": svc}},
        "ports": [{"name": "http", "port": port}],
        "endpoints": [
            {"addresses": [a], "conditions": {"ready": r, "serving": s, "terminating": not r}} for a, r, s in endpoints_
        ],
    }


@pytest.mark.parametrize(
    ("listed", "want"),
    [
        ([("10.0.0.2", True, True), ("10.0.0.3", False, True)], [("10.0.0.2", 8080)]),
        ([("10.0.0.3", False, True), ("10.0.0.4", False, False)], [("10.0.0.3", 8080)]),
        ([("10.0.0.4", False, False)], []),
        ([], []),
    ],
    ids=["ready-only", "serving-when-none-ready", "neither", "empty"],
)
def test_endpoints_ready_else_serving(listed: list[tuple[str, bool, bool]], want: list[tuple[str, int]]) -> None:
    assert list(endpoints([endpoint_slice("m", listed)], "team-a", service("m"), 80)) == want


def test_endpoints_of_another_service_or_port_are_not_taken() -> None:
    slices = [endpoint_slice("other", [("10.0.0.9", True, True)]), endpoint_slice("m", [("10.0.0.2", True, True)])]
    assert endpoints(slices, "team-a", service("m"), 80) == (("10.0.0.2", 8080),)
    assert endpoints(slices, "team-a", service("m"), 81) == ()
    assert endpoints(slices, "team-b", service("m", ns="team-b"), 80) == ()


def test_backends_follow_the_route_and_its_header_filter() -> None:
    route = {
        "metadata": {"name": "r", "namespace": "team-a"},
        "spec": {
            "hostnames": ["M.example"],
            "rules": [{
                "backendRefs": [{"name": "act", "namespace": "sys", "port": 80}],
                "filters": [{"type": "RequestHeaderModifier", "requestHeaderModifier": {
                    "set": [{"name": "x-s", "value": "team-a/m"}], "add": [{"name": "x-a", "value": "1"}]}}],
            }],
        },
    }  # fmt: skip
    services = [service("act", ns="sys")]
    slices = [endpoint_slice("act", [("10.0.0.7", True, True)], ns="sys")]
    grant = {
        "metadata": {"name": "g", "namespace": "sys"},
        "spec": {
            "from": [{"group": "gateway.networking.k8s.io", "kind": "HTTPRoute", "namespace": "team-a"}],
            "to": [{"group": "", "kind": "Service", "name": "act"}],
        },
    }
    found = backends([route], [], services, slices, [grant])
    assert found == [
        Backend("r_team_a_r", ("m.example",), (("x-s", "team-a/m"),), (("x-a", "1"),), (("10.0.0.7", 8080),))
    ]
    # Without a ReferenceGrant in the Service's namespace, the route reaches nothing there.
    assert backends([route], [], services, slices, [])[0].servers == ()


def test_a_grpc_route_is_served_over_http2_on_its_own_listener() -> None:
    grpc_route = {
        "metadata": {"name": "g", "namespace": "team-a"},
        "spec": {"rules": [{"backendRefs": [{"name": "m", "port": 81}]}]},
    }
    http_route = {
        "metadata": {"name": "h", "namespace": "team-a"},
        "spec": {"rules": [{"backendRefs": [{"name": "m"}]}]},
    }
    grpc_service = service("m")
    grpc_service["spec"]["ports"].append({"name": "grpc", "port": 81})
    slices = [endpoint_slice("m", [("10.0.0.2", True, True)])]
    slices[0]["ports"].append({"name": "grpc", "port": 8081})
    found = backends([http_route], [grpc_route], [grpc_service], slices, [])
    assert found == [
        Backend("r_team_a_h", (), (), (), (("10.0.0.2", 8080),)),
        Backend("g_team_a_g", (), (), (), (("10.0.0.2", 8081),), grpc=True),
    ]
    slots = {b.name: [b.servers[0], *[None] * (SLOTS - 1)] for b in found}
    text = render(1000, 1001, found, Path("/s"), slots)
    gateway, grpc = text.split("frontend gateway")[1].split("frontend grpc")
    assert "bind 127.0.0.1:1000\n" in gateway and "default_backend r_team_a_h" in gateway
    assert "bind 127.0.0.1:1001 proto h2" in grpc and "default_backend g_team_a_g" in grpc.split("backend r_")[0]
    backend_g = text.split("\nbackend g_team_a_g")[1]
    assert "server s0 10.0.0.2:8081 proto h2" in backend_g and "disabled proto h2" in backend_g
    backend_r = text.split("\nbackend r_team_a_h")[1].split("\nbackend g_")[0]
    assert "proto h2" not in backend_r


def test_a_grant_for_httproutes_does_not_admit_a_grpc_route() -> None:
    grant = {
        "metadata": {"name": "x", "namespace": "sys"},
        "spec": {
            "from": [{"group": "gateway.networking.k8s.io", "kind": "HTTPRoute", "namespace": "team-a"}],
            "to": [{"group": "", "kind": "Service"}],
        },
    }
    assert granted([grant], "team-a", "sys", "m", "HTTPRoute")
    assert not granted([grant], "team-a", "sys", "m", "GRPCRoute")


def test_a_server_keeps_its_slot_and_a_freed_slot_is_taken_last() -> None:
    empty: list[Any] = [None] * SLOTS
    slots, cursor = assign(empty, (("a", 1), ("b", 1)), 0)
    assert slots[1:3] == [("a", 1), ("b", 1)]
    # a goes, c comes: b stays where it was, c does not take a's slot just freed.
    after, _ = assign(slots, (("b", 1), ("c", 1)), cursor)
    assert after[2] == ("b", 1) and after[1] is None and after[3] == ("c", 1)


def test_commands_add_before_they_remove() -> None:
    before: list[Any] = [("a", 1), None] + [None] * (SLOTS - 2)
    after: list[Any] = [None, ("b", 2)] + [None] * (SLOTS - 2)
    assert commands("be", before, after) == [
        "set server be/s1 addr b port 2",
        "set server be/s1 state ready",
        "set server be/s0 state maint",
    ]


def test_only_a_change_of_routes_needs_a_reload() -> None:
    one = [Backend("r", ("h",), (), (), (("a", 1),))]
    moved = [Backend("r", ("h",), (), (), (("b", 1),))]
    rehosted = [Backend("r", ("h2",), (), (), (("a", 1),))]
    assert structure(one) == structure(moved)
    assert structure(one) != structure(rehosted)


def test_a_slot_just_freed_is_skipped_even_when_it_is_next() -> None:
    before: list[Any] = [None, ("a", 1)] + [None] * (SLOTS - 2)
    after, cursor = assign(before, (("c", 1),), 0)
    assert after[1] is None and after[2] == ("c", 1) and cursor == 2
