"""References to the objects a ModelService names, the typed spec, and which of them is the route.

Purely computational, no side effects. The controller parses the custom resource's dicts into these
types (``drain_router.controller.kube.observe``); nothing here reads a dict from the API.
"""

from __future__ import annotations

import dataclasses

from drain_router.decisions.deletion import knobs

GROUP = "drainrouter.dev"
#: A workload object (or route) carrying this label with another service's name is foreign.
SERVICE_LABEL = "drainrouter.dev/service"

#: Kinds in the Gateway API group that are routes: when ``spec.route`` is not set, the first of these
#: found in ``spec.workload`` is the route.
GATEWAY_GROUP = "gateway.networking.k8s.io"
ROUTE_KINDS = ("HTTPRoute", "GRPCRoute", "TLSRoute", "TCPRoute", "UDPRoute")
INFERENCE_GROUP = "inference.networking.k8s.io"
"""Gateway API Inference Extension: an InferencePool is what a gateway's route sends to, through an
endpoint picker; with no Gateway API route of the service's own, removing the pool stops traffic."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ObjectRef:
    """An object named by ``apiVersion``, ``kind`` and ``name``, in the ModelService's namespace."""

    api_version: str
    kind: str
    name: str

    @property
    def group(self) -> str:
        return self.api_version.rpartition("/")[0]

    def __str__(self) -> str:
        return f"{self.kind}/{self.name}"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ServiceSpec:
    """The parts of a ModelService's ``spec`` the staged deletion reads."""

    route: ObjectRef | None = None
    """``spec.route`` as written (``None`` when not set); :func:`find_route` decides what the route is."""
    workload: tuple[ObjectRef, ...] = ()
    """``spec.workload``, in the order it is deleted."""
    suspend: bool = False
    deletion: knobs.DeletionSpec = knobs.DeletionSpec()


def is_route_kind(ref: ObjectRef) -> bool:
    return ref.group == GATEWAY_GROUP and ref.kind in ROUTE_KINDS


def find_route(spec: ServiceSpec) -> ObjectRef | None:
    """The route to remove first: ``spec.route`` if set, else the first Gateway API route kind listed
    in ``spec.workload`` (so a chart that lists its HTTPRoute with the workload still gets the staged
    order), else the first InferencePool listed there, else ``None`` (outcome NoRoute)."""
    if spec.route is not None:
        return spec.route
    for ref in spec.workload:
        if is_route_kind(ref):
            return ref
    for ref in spec.workload:
        if ref.group == INFERENCE_GROUP and ref.kind == "InferencePool":
            return ref
    return None
