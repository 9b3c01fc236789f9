"""Kubernetes reads for recycling and lifecycle rules -> :class:`Workload`: the Deployments and the pods.

Reads and parsing only, like :mod:`drain_router.controller.kube.observe`.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Mapping
from typing import Any

from drain_router.controller.kube import client as kube_
from drain_router.controller.kube import observe
from drain_router.decisions import deletion, objects, ownership, recycling

DEFAULT_ADMIN_PORT = 9091


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


def _deployment(
    ref: deletion.ObjectRef, obj: Mapping[str, Any] | None, verdict: ownership.Consent | ownership.NotOwned | None
) -> recycling.DeploymentObservation:
    if obj is None:
        return recycling.DeploymentObservation(name=ref.name, exists=False)
    meta, spec, status = obj.get("metadata") or {}, obj.get("spec") or {}, obj.get("status") or {}
    return recycling.DeploymentObservation(
        name=ref.name,
        owned=isinstance(verdict, ownership.Consent),
        generation=int(meta.get("generation") or 1),
        observed_generation=status.get("observedGeneration"),
        spec_replicas=spec.get("replicas"),
        replicas=int(status.get("replicas") or 0),
        updated_replicas=int(status.get("updatedReplicas") or 0),
        ready_replicas=int(status.get("readyReplicas") or 0),
        available_replicas=int(status.get("availableReplicas") or 0),
    )


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Workload:
    """What recycling and lifecycle rules read: the Deployments in ``spec.workload`` and the pods."""

    observation: recycling.WorkloadObservation
    deployment: Mapping[str, Any] | None
    """The Deployment, when ``spec.workload`` names exactly one, it exists and the service owns it."""
    deployment_ref: deletion.ObjectRef | None
    deployment_consent: ownership.Consent | None = None
    """What a scale of ``deployment`` needs (set exactly when ``deployment`` is)."""
    not_owned: tuple[ownership.NotOwned, ...] = ()
    """Deployments named and selected pods that the service does not own: left alone, reported."""
    failures: tuple[deletion.ApiFailure, ...] = ()
    """Failed reads: nothing is decided on a partial picture."""

    @property
    def active_pods(self) -> tuple[objects.Pod, ...]:
        return tuple(p for p in self.observation.pods if p.active)

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
    """Read every Deployment of ``spec.workload`` and the pods ``spec.podSelector`` selects; keep the
    pods the service owns through a ReplicaSet of a Deployment it owns (the others are reported in
    ``not_owned``, never evicted and never counted). Never raises for a failed read: it is listed in
    ``failures``."""
    raw_spec = body.get("spec") or {}
    service = observe.owner(body)
    failures: list[deletion.ApiFailure] = []
    refs = deployment_refs(spec)
    answers = await asyncio.gather(*(observe.try_read(kube.get(ref, service.namespace)) for ref in refs))
    failures.extend(f for _, f in answers if f is not None)
    verdicts = [
        None if obj is None else ownership.check(service, observe.claim(ref.kind, obj))
        for ref, (obj, _) in zip(refs, answers)
    ]
    consents = tuple(v for v in verdicts if isinstance(v, ownership.Consent))
    selected, failure = await observe.selected_pods(kube, service, raw_spec.get("podSelector") or {}, consents)
    if failure is not None:
        failures.append(failure)
    deployments = tuple(_deployment(ref, obj, v) for ref, (obj, _), v in zip(refs, answers, verdicts))
    single = verdicts[0] if len(refs) == 1 else None
    owned_single = single if isinstance(single, ownership.Consent) else None
    not_owned = [v for v in verdicts if isinstance(v, ownership.NotOwned)]
    if selected is not None:
        not_owned.extend(selected.not_owned)
    return Workload(
        observation=recycling.WorkloadObservation(
            service=service.name, deployments=deployments, pods=() if selected is None else selected.owned
        ),
        deployment=answers[0][0] if owned_single is not None else None,
        deployment_ref=refs[0] if owned_single is not None else None,
        deployment_consent=owned_single,
        not_owned=tuple(not_owned),
        failures=tuple(failures),
    )
