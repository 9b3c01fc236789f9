"""Kubernetes reads -> :class:`deletion.Observations`, and the ModelService's dicts -> typed specs.

Reads and parsing only; decisions live in router.decisions and never see a raw API dict.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Mapping
from typing import Any

from router.controller import kube as kube_
from router.decisions import deletion, durations, lifecycle, recycling

DEFAULT_ADMIN_PORT = 9091


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


def _object(
    ref: deletion.ObjectRef, obj: Mapping[str, Any] | None, failure: deletion.ApiFailure | None = None
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
    )


def _pod(obj: Mapping[str, Any]) -> deletion.PodObservation:
    meta, spec, status = obj.get("metadata") or {}, obj.get("spec") or {}, obj.get("status") or {}
    stamp = meta.get("deletionTimestamp")
    grace = meta.get("deletionGracePeriodSeconds")
    if grace is None:
        grace = spec.get("terminationGracePeriodSeconds")
    return deletion.PodObservation(
        name=meta["name"],
        uid=meta.get("uid", ""),
        phase=status.get("phase") or "Pending",
        node=spec.get("nodeName") or None,
        deletion_timestamp=None if not stamp else durations.parse_time(stamp),
        grace=None if grace is None else float(grace),
    )


def node_ready(node: Mapping[str, Any]) -> bool:
    for cond in (node.get("status") or {}).get("conditions") or ():
        if cond.get("type") == "Ready":
            return cond.get("status") == "True"
    return False


async def _read(call: Awaitable[Any]) -> tuple[Any, deletion.ApiFailure | None]:
    """(answer, None), or (None, the failure): a failed read is an observation, not an exception."""
    try:
        return await call, None
    except kube_.CallFailed as exc:
        return None, exc.failure


async def observe(kube: kube_.Kube, body: Mapping[str, Any], spec: deletion.ServiceSpec) -> deletion.Observations:
    """Read the route, the workload objects, the pods and their nodes; ``spec`` is ``body``'s, parsed.

    Never raises for a failed read: it is listed in ``failed_reads`` (and the object is reported as
    existing, since unknown is not gone), so the state machine can wait on it and, at the deadline,
    time out naming the call."""
    meta, raw_spec = body["metadata"], body.get("spec") or {}
    namespace = meta["namespace"]
    failed: list[deletion.FailedRead] = []

    async def read(subject: deletion.Subject, call: Awaitable[Any]) -> Any:
        answer, failure = await _read(call)
        if failure is not None:
            failed.append(deletion.FailedRead(subject=subject, failure=failure))
        return answer, failure

    route_ref = deletion.find_route(spec)
    route = None
    if route_ref is not None:
        route = _object(route_ref, *await read(deletion.Subject.ROUTE, kube.get(route_ref, namespace)))
    answers = await asyncio.gather(
        *(read(deletion.Subject.WORKLOAD, kube.get(ref, namespace)) for ref in spec.workload)
    )
    try:
        selector = label_selector(raw_spec.get("podSelector") or {})
    except ValueError as exc:  # never list every pod; the pod stages wait, then time out naming this
        listed = None
        failed.append(
            deletion.FailedRead(
                subject=deletion.Subject.PODS,
                failure=deletion.ApiFailure(call="LIST v1 pods", code=None, message=f"not sent: {exc}"),
            )
        )
    else:
        listed, _ = await read(deletion.Subject.PODS, kube.list_pods(namespace, selector))
    pods = [_pod(p) for p in listed or ()]
    node_names = sorted({p.node for p in pods if p.node})
    node_answers = await asyncio.gather(*(read(deletion.Subject.NODES, kube.get_node(n)) for n in node_names))
    nodes = {n: node_ready(obj) for n, (obj, _) in zip(node_names, node_answers) if obj is not None}
    return deletion.Observations(
        service=meta["name"],
        suspend=spec.suspend,
        route=route,
        workload=tuple(_object(ref, *answer) for ref, answer in zip(spec.workload, answers)),
        pods=tuple(pods),
        nodes=nodes,
        failed_reads=tuple(failed),
    )


# --- recycling and lifecycle rules ------------------------------------------------------------------


def recycling_spec(data: Mapping[str, Any] | None) -> recycling.RecyclingSpec | None:
    """``spec.recycling`` -> the typed spec; ``None`` when absent (recycling off). Defaults as in the CRD."""
    if data is None:
        return None
    timeout = data.get("maxPodLifetimeIdleTimeoutSeconds")
    return recycling.RecyclingSpec(
        max_pod_lifetime_seconds=float(data.get("maxPodLifetimeSeconds", 86400)),
        wait_for_idle=bool(data.get("waitForIdle", True)),
        idle_timeout_seconds=None if timeout is None else float(timeout),
    )


def admin_port(spec: Mapping[str, Any]) -> int:
    return int((spec.get("router") or {}).get("adminPort") or DEFAULT_ADMIN_PORT)


def deployment_refs(spec: deletion.ServiceSpec) -> tuple[deletion.ObjectRef, ...]:
    return tuple(r for r in spec.workload if r.api_version == "apps/v1" and r.kind == "Deployment")


def _deployment(ref: deletion.ObjectRef, obj: Mapping[str, Any] | None) -> recycling.DeploymentObservation:
    if obj is None:
        return recycling.DeploymentObservation(name=ref.name, exists=False)
    meta, spec, status = obj.get("metadata") or {}, obj.get("spec") or {}, obj.get("status") or {}
    return recycling.DeploymentObservation(
        name=ref.name,
        service_label=(meta.get("labels") or {}).get(deletion.SERVICE_LABEL),
        generation=int(meta.get("generation") or 1),
        observed_generation=status.get("observedGeneration"),
        spec_replicas=spec.get("replicas"),
        replicas=int(status.get("replicas") or 0),
        updated_replicas=int(status.get("updatedReplicas") or 0),
        ready_replicas=int(status.get("readyReplicas") or 0),
        available_replicas=int(status.get("availableReplicas") or 0),
    )


def recycle_pod(obj: Mapping[str, Any]) -> recycling.RecyclePod:
    meta, status = obj.get("metadata") or {}, obj.get("status") or {}
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or ())
    start = status.get("startTime")
    return recycling.RecyclePod(
        name=meta["name"],
        uid=meta.get("uid", ""),
        phase=status.get("phase") or "Pending",
        ready=ready,
        terminating=bool(meta.get("deletionTimestamp")),
        start_time=None if not start else durations.parse_time(start),
        pod_ip=status.get("podIP") or None,
    )


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Workload:
    """What recycling and lifecycle rules read: the Deployments in ``spec.workload`` and the pods."""

    observation: recycling.WorkloadObservation
    deployment: Mapping[str, Any] | None
    """The Deployment, when ``spec.workload`` names exactly one and it exists."""
    deployment_ref: deletion.ObjectRef | None
    failures: tuple[deletion.ApiFailure, ...] = ()
    """Failed reads: nothing is decided on a partial picture."""

    @property
    def active_pods(self) -> tuple[recycling.RecyclePod, ...]:
        return tuple(p for p in self.observation.pods if p.phase not in recycling.IGNORED_POD_PHASES)

    def deployment_state(self) -> tuple[bool, bool, int]:
        """(the Deployment exists, it is being deleted, its ``spec.replicas`` with the default 1)."""
        obj = self.deployment
        if obj is None:
            return False, False, 0
        replicas = (obj.get("spec") or {}).get("replicas")
        return (
            True,
            bool((obj.get("metadata") or {}).get("deletionTimestamp")),
            1 if replicas is None else int(replicas),
        )


async def observe_workload(kube: kube_.Kube, body: Mapping[str, Any], spec: deletion.ServiceSpec) -> Workload:
    """Read every Deployment of ``spec.workload`` and the pods ``spec.podSelector`` selects. Never raises
    for a failed read: it is listed in ``failures``."""
    meta, raw_spec = body["metadata"], body.get("spec") or {}
    namespace = meta["namespace"]
    failures: list[deletion.ApiFailure] = []
    refs = deployment_refs(spec)
    answers = await asyncio.gather(*(_read(kube.get(ref, namespace)) for ref in refs))
    failures.extend(f for _, f in answers if f is not None)
    failure: deletion.ApiFailure | None
    try:
        selector = label_selector(raw_spec.get("podSelector") or {})
    except ValueError as exc:
        listed, failure = None, deletion.ApiFailure(call="LIST v1 pods", code=None, message=f"not sent: {exc}")
    else:
        listed, failure = await _read(kube.list_pods(namespace, selector))
    if failure is not None:
        failures.append(failure)
    deployments = tuple(_deployment(ref, obj) for ref, (obj, _) in zip(refs, answers))
    single = answers[0][0] if len(refs) == 1 else None
    return Workload(
        observation=recycling.WorkloadObservation(
            service=meta["name"], deployments=deployments, pods=tuple(recycle_pod(p) for p in listed or ())
        ),
        deployment=single,
        deployment_ref=refs[0] if len(refs) == 1 else None,
        failures=tuple(failures),
    )


def held_record(data: Mapping[str, Any] | None) -> recycling.HeldRecord | None:
    """``status.recycling.held`` -> the record; anything unreadable counts as nothing held."""
    if not data:
        return None
    try:
        retry = data.get("retryAt")
        return recycling.HeldRecord(
            pod=data["pod"],
            uid=data["uid"],
            reason=recycling.HoldReason(data["reason"]),
            since=durations.parse_time(data["since"]),
            retry_at=None if not retry else durations.parse_time(retry),
        )
    except (KeyError, ValueError, TypeError):
        return None


def held_dict(held: recycling.HeldRecord | None) -> dict[str, Any] | None:
    if held is None:
        return None
    return {
        "pod": held.pod,
        "uid": held.uid,
        "reason": held.reason.value,
        "since": durations.format_time(held.since),
        "retryAt": None if held.retry_at is None else durations.format_time(held.retry_at),
    }


def lifecycle_status(data: Mapping[str, Any] | None) -> lifecycle.LifecycleStatus:
    data = data or {}

    def when(key: str) -> float | None:
        value = data.get(key)
        try:
            return None if not value else durations.parse_time(value)
        except (ValueError, TypeError):
            return None

    return lifecycle.LifecycleStatus(idle_since=when("idleSince"), scaled_to_zero_at=when("scaledToZeroAt"))


def lifecycle_dict(status: lifecycle.LifecycleStatus) -> dict[str, Any]:
    def fmt(value: float | None) -> str | None:
        return None if value is None else durations.format_time(value)

    return {"idleSince": fmt(status.idle_since), "scaledToZeroAt": fmt(status.scaled_to_zero_at)}
