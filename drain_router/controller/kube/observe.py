"""Kubernetes reads -> :class:`deletion.Observations`, and the ModelService's ``spec`` -> typed specs.

Reads and parsing only; decisions live in drain_router.decisions and never see a raw API dict.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Iterable, Mapping, Sequence
from typing import Any

from drain_router.controller.kube import client as kube_
from drain_router.decisions import deletion, durations, objects, ownership


def label_selector(pod_selector: Mapping[str, Any]) -> str:
    """``spec.podSelector`` (a LabelSelector) -> the ``labelSelector`` query string."""
    parts = [f"{k}={v}" for k, v in sorted((pod_selector.get("matchLabels") or {}).items())]
    for expr in pod_selector.get("matchExpressions") or ():
        key, op, values = expr["key"], expr["operator"], ",".join(expr.get("values") or ())
        parts.append(
            {
                "In": f"{key} in ({values})",
                "NotIn": f"{key} notin ({values})",
                "Exists": key,
                "DoesNotExist": f"!{key}",
            }[op]
        )
    if not parts:
        raise ValueError("spec.podSelector selects nothing (empty); refusing to count every pod")
    return ",".join(parts)


def object_ref(data: Mapping[str, Any]) -> deletion.ObjectRef:
    """``{apiVersion, kind, name}`` -> a reference (a missing key is an error, not a default)."""
    return deletion.ObjectRef(api_version=data["apiVersion"], kind=data["kind"], name=data["name"])


def _duration_text(value: Any) -> str | None:
    # The CRD types these as strings; a number arrives only past validation, and is read as its
    # text (a bare ``60`` is then reported invalid like the annotation ``"60"``).
    return None if value is None else str(value)


def deletion_spec(data: Mapping[str, Any] | None) -> deletion.DeletionSpec:
    """``spec.deletion`` -> the raw knob strings (resolved against annotations by the decisions)."""
    data = data or {}
    return deletion.DeletionSpec(
        max_wait=_duration_text(data.get("maxWait")),
        route_settle=_duration_text(data.get("routeSettle")),
        force_delete_after=_duration_text(data.get("forceDeleteAfter")),
    )


def service_spec(spec: Mapping[str, Any]) -> deletion.ServiceSpec:
    """A ModelService's ``spec`` -> what the staged deletion reads."""
    route = spec.get("route")
    return deletion.ServiceSpec(
        route=object_ref(route) if route else None,
        workload=tuple(object_ref(item) for item in spec.get("workload") or ()),
        suspend=bool(spec.get("suspend")),
        deletion=deletion_spec(spec.get("deletion")),
    )


def owner(body: Mapping[str, Any]) -> ownership.Owner:
    """The ModelService as the ownership rule names it."""
    meta = body["metadata"]
    return ownership.Owner(namespace=meta["namespace"], name=meta["name"], uid=meta.get("uid", ""))


def claim(kind: str, obj: Mapping[str, Any]) -> ownership.Claim:
    """What an object read from the API says about whom it belongs to."""
    meta = obj.get("metadata") or {}
    refs = tuple(
        ownership.OwnerRef(
            api_version=str(r.get("apiVersion") or ""),
            kind=str(r.get("kind") or ""),
            name=str(r.get("name") or ""),
            uid=str(r.get("uid") or ""),
            controller=r.get("controller") is True,
        )
        for r in meta.get("ownerReferences") or ()
        if isinstance(r, Mapping)
    )
    labels = meta.get("labels") or {}
    return ownership.Claim(
        kind=kind,
        namespace=meta.get("namespace"),
        name=str(meta.get("name") or ""),
        uid=str(meta.get("uid") or ""),
        resource_version=meta.get("resourceVersion"),
        labels={str(k): str(v) for k, v in labels.items()} if isinstance(labels, Mapping) else {},
        owner_refs=refs,
    )


def _object(
    service: ownership.Owner,
    ref: deletion.ObjectRef,
    obj: Mapping[str, Any] | None,
    failure: deletion.ApiFailure | None = None,
) -> deletion.ObjectObservation:
    if failure is not None:  # unknown: assumed to exist; the stage that needs it waits
        return deletion.ObjectObservation(ref=ref, exists=True)
    if obj is None:
        return deletion.ObjectObservation(ref=ref, exists=False)
    meta = obj.get("metadata") or {}
    return deletion.ObjectObservation(
        ref=ref,
        exists=True,
        deleting=bool(meta.get("deletionTimestamp")),
        service_label=(meta.get("labels") or {}).get(deletion.SERVICE_LABEL),
        verdict=ownership.check(service, claim(ref.kind, obj)),
    )


def deployment_consents(observed: Iterable[deletion.ObjectObservation]) -> tuple[ownership.Consent, ...]:
    """The consents of the owned Deployments among ``observed``: the only owners a pod can prove
    itself the service's through."""
    return tuple(
        o.verdict
        for o in observed
        if o.ref.api_version == "apps/v1" and o.ref.kind == "Deployment" and isinstance(o.verdict, ownership.Consent)
    )


def pod(obj: Mapping[str, Any], consent: ownership.Consent | None = None) -> objects.Pod:
    """A pod as every decision reads it: readiness from its ``Ready`` condition, never its phase."""
    meta, spec, status = obj.get("metadata") or {}, obj.get("spec") or {}, obj.get("status") or {}
    stamp, start = meta.get("deletionTimestamp"), status.get("startTime")
    grace = meta.get("deletionGracePeriodSeconds")
    if grace is None:
        grace = spec.get("terminationGracePeriodSeconds")
    return objects.Pod(
        name=meta["name"],
        uid=meta.get("uid", ""),
        phase=status.get("phase") or "Pending",
        node=spec.get("nodeName") or None,
        ready=any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or ()),
        start_time=None if not start else durations.parse_time(start),
        pod_ip=status.get("podIP") or None,
        deletion_timestamp=None if not stamp else durations.parse_time(stamp),
        grace=None if grace is None else float(grace),
        consent=consent,
    )


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class SelectedPods:
    """The pods ``spec.podSelector`` selects, split by the ownership rule."""

    owned: tuple[objects.Pod, ...] = ()
    """Selected and owned through a ReplicaSet of an owned Deployment, each with its consent."""
    not_owned: tuple[ownership.NotOwned, ...] = ()
    """Selected but not the service's: never evicted, force-deleted or waited for."""


async def selected_pods(
    kube: kube_.Kube,
    service: ownership.Owner,
    pod_selector: Mapping[str, Any],
    deployments: Sequence[ownership.Consent],
) -> tuple[SelectedPods | None, deletion.ApiFailure | None]:
    """The pods ``spec.podSelector`` selects, any phase, split into the ones the service owns (through
    a ReplicaSet whose controller is one of ``deployments``, read here by name) and the others; or
    ``None`` and the failure. An empty selector is a failure too: the list is never sent (it would
    count every pod)."""
    try:
        selector = label_selector(pod_selector)
    except ValueError as exc:
        return None, deletion.ApiFailure(call="LIST v1 pods", code=None, message=f"not sent: {exc}")
    listed, failure = await try_read(kube.list_pods(service.namespace, selector))
    if failure is not None:
        return None, failure
    claims = [(raw, claim("Pod", raw)) for raw in listed or ()]
    names = sorted(
        {
            ref.name
            for _, c in claims
            if (ref := c.controller_ref()) is not None and (ref.group, ref.kind) == ownership.REPLICASET
        }
        if deployments
        else set()
    )
    answers = await asyncio.gather(*(try_read(kube.get(_replicaset(name), service.namespace)) for name in names))
    for _, failed in answers:
        if failed is not None:
            return None, failed
    replicasets = {name: claim("ReplicaSet", obj) for name, (obj, _) in zip(names, answers) if obj is not None}
    owned, not_owned = [], []
    for raw, c in claims:
        verdict = ownership.check_pod(service, c, replicasets, deployments)
        if isinstance(verdict, ownership.Consent):
            owned.append(pod(raw, verdict))
        else:
            not_owned.append((raw, verdict))
    if not_owned and names:
        # The pods were listed before their ReplicaSets were read: one deleted in the foreground
        # since then went with its pods, which were listed all the same. A pod not owned is one
        # still there when listed again after those reads; one gone since was the service's.
        again, failure = await try_read(kube.list_pods(service.namespace, selector))
        if failure is not None:
            return None, failure
        present = {(p.get("metadata") or {}).get("uid") for p in again or ()}
        not_owned = [(raw, v) for raw, v in not_owned if (raw.get("metadata") or {}).get("uid") in present]
    return SelectedPods(owned=tuple(owned), not_owned=tuple(v for _, v in not_owned)), None


def _replicaset(name: str) -> deletion.ObjectRef:
    return deletion.ObjectRef(api_version="apps/v1", kind="ReplicaSet", name=name)


def node_ready(node: Mapping[str, Any]) -> bool:
    for cond in (node.get("status") or {}).get("conditions") or ():
        if cond.get("type") == "Ready":
            status: object = cond.get("status")
            return status == "True"
    return False


async def try_read(call: Awaitable[Any]) -> tuple[Any, deletion.ApiFailure | None]:
    """(answer, None), or (None, the failure): a failed read is an observation, not an exception."""
    try:
        return await call, None
    except kube_.CallFailed as exc:
        return None, exc.failure


async def observe(
    kube: kube_.Kube, body: Mapping[str, Any], spec: deletion.ServiceSpec, *, read_nodes: bool = True
) -> deletion.Observations:
    """Read the route, the workload objects, the pods and their nodes; ``spec`` is ``body``'s, parsed.
    Without ``read_nodes`` (no access to nodes) every pod's node is reported Ready.

    Never raises for a failed read: it is listed in ``failed_reads`` (and the object is reported as
    existing, since unknown is not gone), so the state machine can wait on it and, at the deadline,
    time out naming the call."""
    meta, raw_spec = body["metadata"], body.get("spec") or {}
    namespace = meta["namespace"]
    failed: list[deletion.FailedRead] = []

    async def read(subject: deletion.Subject, call: Awaitable[Any]) -> Any:
        answer, failure = await try_read(call)
        if failure is not None:
            failed.append(deletion.FailedRead(subject=subject, failure=failure))
        return answer, failure

    service = owner(body)
    route_ref = deletion.find_route(spec)
    route = None
    if route_ref is not None:
        route = _object(service, route_ref, *await read(deletion.Subject.ROUTE, kube.get(route_ref, namespace)))
    answers = await asyncio.gather(
        *(read(deletion.Subject.WORKLOAD, kube.get(ref, namespace)) for ref in spec.workload)
    )
    workload = tuple(_object(service, ref, *answer) for ref, answer in zip(spec.workload, answers))
    # A failed list (or an empty selector, never sent): the pod stages wait, then time out naming it.
    selected, failure = await selected_pods(
        kube, service, raw_spec.get("podSelector") or {}, deployment_consents(workload)
    )
    if failure is not None:
        failed.append(deletion.FailedRead(subject=deletion.Subject.PODS, failure=failure))
    pods = () if selected is None else selected.owned
    node_names = sorted({p.node for p in pods if p.node})
    if read_nodes:
        node_answers = await asyncio.gather(*(read(deletion.Subject.NODES, kube.get_node(n)) for n in node_names))
        nodes = {n: node_ready(obj) for n, (obj, _) in zip(node_names, node_answers) if obj is not None}
    else:
        nodes = dict.fromkeys(node_names, True)
    return deletion.Observations(
        service=meta["name"],
        suspend=spec.suspend,
        route=route,
        workload=workload,
        pods=pods,
        ignored_pods=() if selected is None else selected.not_owned,
        nodes=nodes,
        failed_reads=tuple(failed),
    )
