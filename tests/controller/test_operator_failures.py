"""``maxWait`` is an overall budget, also when the API server keeps refusing.

A read that fails (a route kind the API server does not serve, a 500 on a GET) or a workload DELETE
that keeps answering 403 must not leave kopf retrying forever with no status and the finalizer held:
the status says what fails, and at the deadline the finalizer is dropped with outcome TimedOut and a
Warning that names the failing call.
"""

from __future__ import annotations

import kmock

from .conftest import NAMESPACE, ClusterEmulator, Operator, eventually
from .scenario import delete_msvc, delete_order, event_messages, exists, final_status, make_service, message, msvc


async def test_emulator_fault_answers_a_status_and_never_mutates(cluster: tuple[ClusterEmulator, kmock.Server]) -> None:
    """The emulator's injected error answers with a real Status body, leaves the object alone, and
    stops after heal(); a group version removed from ``resources`` answers 404 to discovery."""
    emu, server = cluster
    del emu.resources["gateway.networking.k8s.io/v1/httproutes"]
    response = await server.client.get("/apis/gateway.networking.k8s.io/v1")
    assert response.status == 404
    await make_service(emu, route_object=False)
    emu.fail("delete", "apps/v1/deployments", "llama", 403, "Forbidden", "not allowed")
    url = f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/llama"
    response = await server.client.delete(url)
    body = await response.json()
    assert response.status == 403
    assert (body["kind"], body["code"], body["reason"], body["message"]) == ("Status", 403, "Forbidden", "not allowed")
    assert exists(emu, "apps/v1/deployments")
    emu.heal()
    response = await server.client.delete(url)
    assert response.status == 200 and not exists(emu, "apps/v1/deployments")


def timed_out_warning(cluster: ClusterEmulator, call: str) -> bool:
    return any(
        kind == "Warning" and reason == "TimedOut" and call in text for kind, reason, text in event_messages(cluster)
    )


async def test_unserved_route_kind_times_out_naming_the_call(
    cluster: tuple[ClusterEmulator, kmock.Server], operator: Operator
) -> None:
    """1. The Gateway API is not installed: discovery of gateway.networking.k8s.io/v1 answers 404, and
    the ModelService names an HTTPRoute. maxWait 2s. 2. Deleted. Result: the status says the route
    cannot be read (the clock started, nothing deleted on unknown state); at the deadline the
    ModelService goes with outcome TimedOut and a TimedOut warning naming the GET and its 404."""
    emu, server = cluster
    del emu.resources["gateway.networking.k8s.io/v1/httproutes"]
    await make_service(emu, route_object=False, deletion_spec={"maxWait": "2s"})
    await delete_msvc(emu, server)
    call = "GET gateway.networking.k8s.io/v1 httproutes/llama: 404"
    await eventually(lambda: f"cannot read {call}" in message(emu), what="the failing read in the status")
    await eventually(lambda: msvc(emu) is None, what="release at the deadline")
    last = final_status(emu)
    assert last["stage"] == "Released" and last["outcome"] == "TimedOut"
    assert call in last["message"], last["message"]
    await eventually(lambda: timed_out_warning(emu, call), what="a TimedOut warning naming the GET")
    assert delete_order(emu) == [] and exists(emu, "apps/v1/deployments")


async def test_failing_get_times_out_naming_the_call(
    cluster: tuple[ClusterEmulator, kmock.Server], operator: Operator
) -> None:
    """1. Every GET of the Deployment answers 500. maxWait 2s. 2. Deleted. Result: TimedOut at the
    deadline, the warning names GET apps/v1 deployments/llama and its 500."""
    emu, server = cluster
    await make_service(emu, deletion_spec={"maxWait": "2s"})
    emu.fail("fetch", "apps/v1/deployments", "llama", 500, "InternalError", "etcdserver: request timed out")
    await delete_msvc(emu, server)
    await eventually(lambda: msvc(emu) is None, what="release at the deadline")
    assert final_status(emu)["outcome"] == "TimedOut"
    await eventually(
        lambda: timed_out_warning(emu, "GET apps/v1 deployments/llama: 500 etcdserver: request timed out"),
        what="a TimedOut warning naming the GET",
    )


async def test_refused_workload_delete_times_out_naming_the_call(
    cluster: tuple[ClusterEmulator, kmock.Server], operator: Operator
) -> None:
    """1. DELETE of the Deployment answers 403; routeSettle 0s, maxWait 3s. 2. Deleted. Result: the
    route and the Service go, the stage stays Uninstalling with the refusal in the status message,
    then at the deadline TimedOut with a warning naming DELETE apps/v1 deployments/llama and its 403;
    the Deployment is still there."""
    emu, server = cluster
    await make_service(emu, deletion_spec={"routeSettle": "0s", "maxWait": "3s"})
    emu.fail(
        "delete",
        "apps/v1/deployments",
        "llama",
        403,
        "Forbidden",
        'deployments.apps "llama" is forbidden: User "system:serviceaccount:ns:ctl" cannot delete',
    )
    await delete_msvc(emu, server)
    call = "DELETE apps/v1 deployments/llama: 403"
    await eventually(lambda: f"last attempt failed: {call}" in message(emu), what="the refusal in the status")
    await eventually(lambda: msvc(emu) is None, what="release at the deadline")
    last = final_status(emu)
    assert last["outcome"] == "TimedOut" and "not deleted: Deployment/llama" in last["message"], last["message"]
    await eventually(lambda: timed_out_warning(emu, call), what="a TimedOut warning naming the DELETE")
    assert exists(emu, "apps/v1/deployments") and not exists(emu, "v1/services")


async def test_pod_selector_that_selects_nothing_times_out(
    cluster: tuple[ClusterEmulator, kmock.Server], operator: Operator
) -> None:
    """1. spec.podSelector is {matchLabels: {}} (admitted by the CRD's minProperties, selects every
    pod). routeSettle 0s, maxWait 2s. 2. Deleted. Result: route and workload go, but the pods are
    never listed with an empty selector; at the deadline TimedOut, naming the pod list not sent."""
    emu, server = cluster
    await make_service(emu, pod_selector={"matchLabels": {}}, deletion_spec={"routeSettle": "0s", "maxWait": "2s"})
    await delete_msvc(emu, server)
    await eventually(lambda: msvc(emu) is None, what="release at the deadline")
    last = final_status(emu)
    assert (
        last["outcome"] == "TimedOut" and "LIST v1 pods: not sent: spec.podSelector selects nothing" in last["message"]
    )
    assert not exists(emu, "apps/v1/deployments")
    await eventually(lambda: timed_out_warning(emu, "LIST v1 pods: not sent"), what="a TimedOut warning naming it")
