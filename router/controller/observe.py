"""Kubernetes reads -> :class:`deletion.Observations`. Reads only; decisions live in router.decisions."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from router.controller import kube as kube_
from router.decisions import deletion, durations


def label_selector(pod_selector: Mapping[str, Any]) -> str:
    """``spec.podSelector`` (a LabelSelector) -> the ``labelSelector`` query string."""
    parts = [f"{k}={v}" for k, v in sorted((pod_selector.get("matchLabels") or {}).items())]
    for expr in pod_selector.get("matchExpressions") or ():
        key, op, values = expr["key"], expr["operator"], ",".join(expr.get("values") or ())
        parts.append({"In": f"{key} in ({values})", "NotIn": f"{key} notin ({values})",
                      "Exists": key, "DoesNotExist": f"!{key}"}[op])
    if not parts:
        raise ValueError("spec.podSelector selects nothing (empty); refusing to count every pod")
    return ",".join(parts)


def _object(ref: deletion.ObjectRef, obj: Mapping[str, Any] | None) -> deletion.ObjectObservation:
    if obj is None:
        return deletion.ObjectObservation(ref=ref, exists=False)
    meta = obj.get("metadata") or {}
    return deletion.ObjectObservation(
        ref=ref, exists=True, deleting=bool(meta.get("deletionTimestamp")),
        service_label=(meta.get("labels") or {}).get(deletion.SERVICE_LABEL))


def _pod(obj: Mapping[str, Any]) -> deletion.PodObservation:
    meta, spec, status = obj.get("metadata") or {}, obj.get("spec") or {}, obj.get("status") or {}
    stamp = meta.get("deletionTimestamp")
    grace = meta.get("deletionGracePeriodSeconds")
    if grace is None:
        grace = spec.get("terminationGracePeriodSeconds")
    return deletion.PodObservation(
        name=meta["name"], uid=meta.get("uid", ""), phase=status.get("phase") or "Pending",
        node=spec.get("nodeName") or None,
        deletion_timestamp=None if not stamp else durations.parse_time(stamp),
        grace=None if grace is None else float(grace))


def node_ready(node: Mapping[str, Any]) -> bool:
    for cond in (node.get("status") or {}).get("conditions") or ():
        if cond.get("type") == "Ready":
            return cond.get("status") == "True"
    return False


async def observe(kube: kube_.Kube, body: Mapping[str, Any]) -> deletion.Observations:
    meta, spec = body["metadata"], body.get("spec") or {}
    namespace = meta["namespace"]
    route_ref = deletion.find_route(spec)
    refs = deletion.workload_refs(spec)
    targets = ([route_ref] if route_ref else []) + list(refs)
    objs = list(await asyncio.gather(*(kube.get(ref, namespace) for ref in targets)))
    route_obj = objs.pop(0) if route_ref else None
    pods = [_pod(p) for p in await kube.list_pods(namespace, label_selector(spec.get("podSelector") or {}))]
    node_names = sorted({p.node for p in pods if p.node})
    node_objs = await asyncio.gather(*(kube.get_node(n) for n in node_names))
    nodes = {n: node_ready(obj) for n, obj in zip(node_names, node_objs) if obj is not None}
    return deletion.Observations(
        service=meta["name"], suspend=bool(spec.get("suspend")),
        route=None if route_ref is None else _object(route_ref, route_obj),
        workload=tuple(_object(ref, obj) for ref, obj in zip(refs, objs)),
        pods=tuple(pods), nodes=nodes)
