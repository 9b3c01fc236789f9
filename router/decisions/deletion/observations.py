"""What the controller saw in the cluster on one pass, as the state machine reads it.

Purely computational, no side effects: frozen values built by ``router.controller.observe``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from router.decisions.deletion.refs import ObjectRef


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ObjectObservation:
    ref: ObjectRef
    exists: bool
    deleting: bool = False
    """Has a deletionTimestamp: counts as deleted (we asked, or someone did)."""
    service_label: str | None = None
    """Value of the ``drainrouter.dev/service`` label, if any."""

    def foreign_to(self, service: str) -> bool:
        return self.exists and self.service_label is not None and self.service_label != service


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class PodObservation:
    name: str
    uid: str
    phase: str = "Running"
    node: str | None = None
    deletion_timestamp: float | None = None
    """When the grace ends (Kubernetes sets it to request time + grace)."""
    grace: float | None = None
    """``deletionGracePeriodSeconds`` when terminating, else the pod's terminationGracePeriodSeconds."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Observations:
    service: str
    """The ModelService's name (foreign checks)."""
    suspend: bool = False
    route: ObjectObservation | None = None
    """``None``: no route configured (NoRoute)."""
    workload: tuple[ObjectObservation, ...] = ()
    pods: tuple[PodObservation, ...] = ()
    """Pods matching ``spec.podSelector`` in the namespace, any phase."""
    nodes: Mapping[str, bool] = dataclasses.field(default_factory=dict)
    """Node name -> Ready, for the nodes of the listed pods. A name not here is a missing node."""
