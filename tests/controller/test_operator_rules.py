"""Four rules of the staged deletion that held in code with no test to catch a break.

Each test runs the real operator against the emulator and fails when its rule is broken:
the status is written before the action it records; an invalid annotation posts an
``InvalidAnnotation`` warning and falls back; annotations are re-read on every pass (one added after
the delete takes effect); a pod on a NotReady node counts as gone once past its grace.
"""

from __future__ import annotations

from typing import Any

import kmock

from drain_router.controller import crd
from drain_router.decisions import deletion, durations

from .conftest import NAMESPACE, ClusterEmulator, Operator, eventually
from .scenario import (
    delete_msvc,
    event_messages,
    exists,
    final_status,
    make_service,
    message,
    msvc,
    msvc_url,
    stage,
)


def _writes_and_deletes(cluster: ClusterEmulator) -> list[tuple[str, Any]]:
    """The API server's request log, reduced to ("status", status.deletion written) and
    ("delete", "<plural>/<name>" or "<plural>/<name>@grace0"), in the order the server saw them."""
    out: list[tuple[str, Any]] = []
    for r in cluster._requests:
        if r.resource is None:
            continue
        if r.resource.plural == crd.plural() and r.subresource == "status" and isinstance(r.data, dict):
            written = (r.data.get("status") or {}).get("deletion")
            if written is not None:
                out.append(("status", written))
        elif r.action == kmock.action.DELETE and r.resource.plural != crd.plural():
            grace0 = isinstance(r.data, dict) and r.data.get("gracePeriodSeconds") == 0
            out.append(("delete", f"{r.resource.plural}/{r.name}{'@grace0' if grace0 else ''}"))
    return out


async def test_status_is_written_before_the_action_it_records(
    cluster: tuple[ClusterEmulator, kmock.Server], operator: Operator
) -> None:
    """1. routeSettle 0s, forceDeleteAfter 1s, pods that ignore SIGTERM (grace 600 s). 2. Deleted.
    Result: in the API server's request log, each DELETE comes after a status write that records it:
    the route's after stage RouteRemoving, the Deployment's and the Service's after Uninstalling,
    each grace-0 pod delete after a status listing that pod in forceDeleted."""
    emu, server = cluster
    await make_service(emu, grace=600, exits_after=None, deletion_spec={"routeSettle": "0s", "forceDeleteAfter": "1s"})
    await delete_msvc(emu, server)
    await eventually(lambda: msvc(emu) is None, what="release after force delete")
    log = _writes_and_deletes(emu)
    deletes = [what for kind, what in log if kind == "delete"]
    assert {
        "httproutes/llama",
        "deployments/llama",
        "services/llama",
        "pods/llama-0@grace0",
        "pods/llama-1@grace0",
    } <= set(deletes), deletes
    last: dict[str, Any] | None = None
    for kind, what in log:
        if kind == "status":
            last = what
            continue
        assert last is not None, f"{what} deleted before any status was written"
        if what == "httproutes/llama":
            assert last["stage"] == "RouteRemoving", (what, last)
        elif what in ("deployments/llama", "services/llama"):
            assert last["stage"] == "Uninstalling", (what, last)
        elif what.endswith("@grace0"):
            pod = what.removeprefix("pods/").removesuffix("@grace0")
            assert last["stage"] == "ForceDeleting" and pod in last["forceDeleted"], (what, last)


async def test_invalid_annotation_warns_once_and_falls_back(
    cluster: tuple[ClusterEmulator, kmock.Server], operator: Operator
) -> None:
    """1. Annotation route-settle "soon" (invalid), spec.deletion.routeSettle 0s. 2. Deleted. Result:
    one Warning InvalidAnnotation naming the annotation and its value (not one per pass), and the
    spec's 0s is used: the workload goes right after the route, not after the 60 s default."""
    emu, server = cluster
    await make_service(emu, annotations={deletion.ANNOTATION_ROUTE_SETTLE: "soon"}, deletion_spec={"routeSettle": "0s"})
    await delete_msvc(emu, server)
    await eventually(lambda: msvc(emu) is None, what="release with the spec's settle")
    last = final_status(emu)
    assert durations.parse_time(last["uninstalledAt"]) - durations.parse_time(last["routeRemovedAt"]) < 5

    def warnings() -> list[str]:
        return [
            text for kind, reason, text in event_messages(emu) if (kind, reason) == ("Warning", "InvalidAnnotation")
        ]

    await eventually(warnings, what="the InvalidAnnotation warning")
    (text,) = warnings()
    assert "drainrouter.dev/route-settle='soon'" in text, text


async def test_annotation_added_after_the_delete_is_read(
    cluster: tuple[ClusterEmulator, kmock.Server], operator: Operator
) -> None:
    """1. Pods ignore SIGTERM with a 600 s grace; no force delete configured. 2. Deleted; the
    deletion reaches PodsTerminating and waits there. 3. The annotation force-delete-after: 0s is
    added to the ModelService. Result: the next passes read it: the pods are force deleted and the
    ModelService is released with outcome PodsForceDeleted, long before the pods' grace."""
    emu, server = cluster
    await make_service(emu, grace=600, exits_after=None, deletion_spec={"routeSettle": "0s"})
    await delete_msvc(emu, server)
    await eventually(lambda: stage(emu) == "PodsTerminating", what="PodsTerminating")
    await eventually(lambda: message(emu) == "waiting for 2 pods", what="the pods' wait")
    response = await server.client.patch(
        msvc_url(),
        json={"metadata": {"annotations": {deletion.ANNOTATION_FORCE_DELETE_AFTER: "0s"}}},
        headers={"Content-Type": "application/merge-patch+json"},
    )
    assert response.status == 200, await response.text()
    await eventually(lambda: msvc(emu) is None, what="release after the annotation's force delete")
    assert final_status(emu)["outcome"] == "PodsForceDeleted"
    assert not exists(emu, "v1/pods", "llama-0")


async def test_pod_on_notready_node_counts_as_gone_past_its_grace(
    cluster: tuple[ClusterEmulator, kmock.Server], operator: Operator
) -> None:
    """1. The pods' node gpu-1 is NotReady, so no kubelet will ever confirm their end; grace 1 s.
    2. Deleted. Result: while within their grace they are waited for and reported stuck on the
    NotReady node; past it they count as gone and the ModelService is released (outcome Clean) while
    the pod objects still exist, Terminating."""
    emu, server = cluster
    await make_service(emu, grace=1, exits_after=None, deletion_spec={"routeSettle": "0s"})
    await emu.set_node_ready("gpu-1", False)
    await delete_msvc(emu, server)
    await eventually(lambda: msvc(emu) is None, timeout=15, what="release past the grace on a NotReady node")
    assert final_status(emu)["outcome"] == "Clean"
    pod = emu.get("v1/pods", NAMESPACE, "llama-0")
    assert pod is not None and pod["metadata"].get("deletionTimestamp"), "the pod should still be Terminating"
    stuck = [
        w
        for w in emu._requests
        if w.resource is not None
        and w.resource.plural == crd.plural()
        and w.subresource == "status"
        and isinstance(w.data, dict)
        and "stuck on NotReady node gpu-1" in str(w.data)
    ]
    assert stuck, "the wait within the grace was never reported"
