"""The wake scenarios' reading of the cluster (e2e/kubernetes/wake.py): the invariants replayed from a
history, each broken once on purpose; kube-proxy's rules; the user's objects compared; the audit's
writes."""

from __future__ import annotations

import time
from typing import Any

import pytest

from e2e.kubernetes.audit import Call
from e2e.kubernetes.history import Change, History
from e2e.kubernetes.wake import Wake, kube_proxy_destinations, ready_addresses, same_object, writes_to_users_objects

NS = "team-a"
SVC = "kd0-drain-router"
POD_SLICE = f"{SVC}-abcde"
OUR_SLICE = f"{SVC}-drain-router"


def endpoint_slice(name: str, addresses: list[str], *, ours: bool) -> dict[str, Any]:
    manager = "drain-router.dev" if ours else "endpointslice-controller.k8s.io"
    labels = {"kubernetes.io/service-name": SVC, "endpointslice.kubernetes.io/managed-by": manager}
    if ours:
        labels["drainrouter.dev/service"] = SVC
    return {
        "kind": "EndpointSlice",
        "metadata": {
            "name": name,
            "namespace": NS,
            "labels": labels,
            "ownerReferences": [{"kind": "ModelService", "name": SVC}] if ours else [],
        },
        "ports": [{"name": "http", "port": 20000 if ours else 8080}],
        "endpoints": [{"addresses": [a], "conditions": {"ready": True}} for a in addresses],
    }


def deployment(replicas: int) -> dict[str, Any]:
    return {"kind": "Deployment", "metadata": {"name": SVC}, "spec": {"replicas": replicas}}


def pod(name: str, ready: bool) -> dict[str, Any]:
    status = "True" if ready else "False"
    return {
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/instance": "kd0"}},
        "status": {"conditions": [{"type": "Ready", "status": status}]},
    }


def service(version: str = "5") -> dict[str, Any]:
    return {"kind": "Service", "metadata": {"name": SVC, "resourceVersion": version}, "spec": {"ports": []}}


#: A sleep and a wake as the API server orders them: (version, object or (kind, name) deleted).
GOOD: list[tuple[int, Any]] = [
    (10, endpoint_slice(OUR_SLICE, ["10.244.0.2", "10.244.0.3"], ours=True)),
    (11, deployment(0)),
    (12, endpoint_slice(POD_SLICE, [], ours=False)),
    (13, ("Pod", "p1")),
    (14, ("Pod", "p2")),
    (15, deployment(2)),
    (16, pod("p3", ready=False)),
    (17, pod("p3", ready=True)),
    (18, endpoint_slice(POD_SLICE, ["10.244.0.9"], ours=False)),
    (19, ("EndpointSlice", OUR_SLICE)),
]


def history(steps: list[tuple[int, Any]], *, service_version: str = "5") -> History:
    h = History(api=None, namespace=NS, kinds=())  # type: ignore[arg-type]
    for obj in (
        deployment(2),
        endpoint_slice(POD_SLICE, ["10.244.0.7", "10.244.0.8"], ours=False),
        pod("p1", ready=True),
        pod("p2", ready=True),
        service(),
    ):
        h.initial[(obj["kind"], obj["metadata"]["name"])] = obj
    for offset, (version, what) in enumerate(steps):
        deleted = isinstance(what, tuple)
        kind, name = what if deleted else (what["kind"], what["metadata"]["name"])
        obj = {"kind": kind, "metadata": {"name": name}} if deleted else what
        h.changes.append(Change(version, kind, name, obj, deleted, time.monotonic() + offset))
    if service_version != "5":
        h.changes.append(Change(99, "Service", SVC, service(service_version), False, time.monotonic() + 99))
    return h


def wake() -> Wake:
    return Wake(NS, SVC, "kd0", {"Service": service()})


def test_a_sleep_and_a_wake_in_order_pass_with_their_margins() -> None:
    said = wake().check_history(history(GOOD))
    assert "never without a ready endpoint" in said and "scaled to 0 1.00 s after" in said, said
    assert "deleted 2.00 s after the first pod was Ready (1.00 s after" in said, said


def swap(steps: list[tuple[int, Any]], a: int, b: int) -> list[tuple[int, Any]]:
    """The same writes with the versions of ``a`` and ``b`` exchanged (b written first)."""
    out = list(steps)
    (va, wa), (vb, wb) = out[a], out[b]
    out[a], out[b] = (va, wb), (vb, wa)
    return out


@pytest.mark.parametrize(
    ("steps", "said"),
    [
        (swap(GOOD, 0, 1), "the Deployment was at 0 with no ready activator endpoint"),
        ([s for s in GOOD if s[0] != 10], "the Deployment was at 0 with no ready activator endpoint"),
        (swap(GOOD, 7, 9), "had no ready endpoint"),
        ([(v, pod("p3", ready=False) if v == 17 else w) for v, w in GOOD], "went before a ready pod"),
        (swap(GOOD, 8, 9), "had no ready endpoint"),
    ],
    ids=[
        "scaled-before-the-slice",
        "no-activator-slice",
        "slice-deleted-before-any-pod",
        "slice-deleted-with-no-ready-pod",
        "slice-deleted-before-the-pods-slice",
    ],
)
def test_each_broken_order_fails(steps: list[tuple[int, Any]], said: str) -> None:
    with pytest.raises(AssertionError, match=said):
        wake().check_history(history(steps))


def test_a_written_service_fails() -> None:
    with pytest.raises(AssertionError, match="the Service was written"):
        wake().check_history(history(GOOD, service_version="77"))


def test_asleep_names_the_activator_pods_on_the_assigned_port() -> None:
    svc = {"spec": {"ports": [{"name": "http", "port": 80}]}}
    ours = endpoint_slice(OUR_SLICE, ["10.244.0.2"], ours=True)
    empty = endpoint_slice(POD_SLICE, [], ours=False)
    wake().check_asleep([ours, empty], svc, {"http": 20000}, {"10.244.0.2"})
    with pytest.raises(AssertionError):
        wake().check_asleep([ours, empty], svc, {"http": 20001}, {"10.244.0.2"})
    with pytest.raises(AssertionError):
        wake().check_asleep([ours, empty], svc, {"http": 20000}, {"10.244.0.2", "10.244.0.3"})
    with pytest.raises(AssertionError):
        wake().check_asleep(
            [ours, endpoint_slice(POD_SLICE, ["10.244.0.9"], ours=False)], svc, {"http": 20000}, {"10.244.0.2"}
        )
    assert ready_addresses([ours, empty], SVC) == {"10.244.0.2"}
    assert ready_addresses([ours, empty], SVC, ours=False) == set()


IPTABLES = """\
*nat
:KUBE-SEP-AAA - [0:0]
-A KUBE-SEP-AAA -s 10.244.0.2/32 -m comment --comment "team-a/ks-drain-router:http" -j KUBE-MARK-MASQ
-A KUBE-SEP-AAA -p tcp -m comment --comment "team-a/ks-drain-router:http" -m tcp -j DNAT --to-destination 10.244.0.2:20000
-A KUBE-SEP-BBB -p tcp -m comment --comment team-a/ks-drain-router:http -m tcp -j DNAT --to-destination 10.244.0.3:20000
-A KUBE-SEP-CCC -p tcp -m comment --comment "team-a/ks-drain-router:grpc" -m tcp -j DNAT --to-destination 10.244.0.3:20001
-A KUBE-SEP-DDD -p tcp -m comment --comment "team-a/other:http" -m tcp -j DNAT --to-destination 10.244.0.9:8080
-A KUBE-SVC-XYZ -m comment --comment "team-a/ks-drain-router:http -> 10.244.0.2:20000" -j KUBE-SEP-AAA
COMMIT
"""


def test_kube_proxy_destinations_of_one_service_port() -> None:
    assert kube_proxy_destinations(IPTABLES, "team-a", "ks-drain-router", "http") == {
        ("10.244.0.2", 20000),
        ("10.244.0.3", 20000),
    }
    assert kube_proxy_destinations(IPTABLES, "team-a", "ks-drain-router", "grpc") == {("10.244.0.3", 20001)}
    assert kube_proxy_destinations(IPTABLES, "team-b", "ks-drain-router", "http") == set()


def test_same_object_is_version_and_content() -> None:
    before = {"metadata": {"resourceVersion": "5", "labels": {"a": "b"}}, "spec": {"x": 1}}
    assert same_object(before, {**before, "status": {"y": 2}})
    assert not same_object(before, {**before, "metadata": {**before["metadata"], "resourceVersion": "6"}})
    assert not same_object(before, {**before, "spec": {"x": 2}})
    assert not same_object(before, {**before, "metadata": {**before["metadata"], "annotations": {"k": "v"}}})


def call(user: str, verb: str, resource: str) -> Call:
    return Call(user, verb, resource, "", NS, SVC, 200, 0.0, 0.0)


def test_writes_to_the_users_objects_by_the_components_only() -> None:
    calls = [
        call("ctl", "patch", "httproutes"),
        call("ctl", "get", "httproutes"),
        call("act", "update", "services"),
        call("ctl", "create", "endpointslices"),
        call("admin", "patch", "httproutes"),
        call("ctl", "delete", "referencegrants"),
        call("ctl", "patch", "grpcroutes"),
    ]
    assert writes_to_users_objects(calls, ("ctl", "act")) == [
        str(calls[0]),
        str(calls[2]),
        str(calls[5]),
        str(calls[6]),
    ]
