"""The activator's own decisions: which ports it listens on, and when and how it asks for a wake.
Purely computational, no side effects (the controller's side is :mod:`.activation`, the port map
:mod:`.service_ports`).

- A request's service is the one its port is assigned to in the port map (:mod:`.service_ports`),
  never anything the client sends: the activator opens a listener per assigned port
  (:func:`plan_listeners`, bounded by ``--max-services``) and a connection to any other port is
  refused by the kernel.
- A wake is asked for by writing ``status.lifecycle.wakeRequestedAt`` on the ModelService (the
  controller's watch already delivers every write to it, the field survives a controller restart or a
  leader change, and the activator needs no address of the leader): only while a request is held and
  no wake is pending (:func:`should_request_wake`), as a merge patch of the status subresource
  carrying the ``resourceVersion`` it read (:func:`wake_patch`), so two activator replicas, or a
  controller write in between, never overwrite each other: a 409 means read again at the next poll
  and decide again.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

from drain_router.decisions import durations
from drain_router.decisions.activation import ActivationStatus, Phase
from drain_router.decisions.service_ports import Assignment

_LABEL = r"[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?"
_CONFIGMAP = re.compile(rf"(?:(?P<namespace>{_LABEL})/)?(?P<name>{_LABEL}(?:\.{_LABEL})*)")
MAX_NAME_LENGTH = 253


def configmap_ref(text: str, default_namespace: str | None) -> tuple[str, str]:
    """``NAMESPACE/NAME`` (or ``NAME`` with ``default_namespace``, the pod's own) of the port map's
    ConfigMap; ``ValueError`` saying what is wrong."""
    match = _CONFIGMAP.fullmatch(text.strip())
    if match is None or len(match["name"]) > MAX_NAME_LENGTH:
        raise ValueError(f"{text!r}: expected NAMESPACE/NAME (a namespace and a ConfigMap name)")
    namespace = match["namespace"] or default_namespace
    if not namespace:
        raise ValueError(f"{text!r}: no namespace given, and none known (not in a cluster): use NAMESPACE/NAME")
    return namespace, match["name"]


@dataclasses.dataclass(frozen=True, slots=True)
class ListenPlan:
    """What the activator's listeners become after a read of the port map."""

    close: tuple[int, ...]
    """Ports listened on now that leave (unassigned, or assigned to another service or protocol)."""
    open: tuple[tuple[int, Assignment], ...]
    """Ports to open, in port order."""
    over: tuple[Assignment, ...]
    """Assignments left without a listener: their service is past ``max_services``."""


def plan_listeners(
    table: Mapping[int, Assignment], listening: Mapping[int, Assignment], max_services: int
) -> ListenPlan:
    """The listeners for the port map ``table``, given those open now (``listening``): a port keeps
    its listener while it keeps its assignment; at most ``max_services`` services get listeners
    (each service's every port), those listened to already first, then by lowest port, so a newly
    assigned service never takes the place of one that clients are reaching."""
    close = tuple(sorted(port for port, held in listening.items() if table.get(port) != held))
    kept = {port: held for port, held in listening.items() if table.get(port) == held}
    services = {(a.namespace, a.name) for a in kept.values()}
    opened: list[tuple[int, Assignment]] = []
    over: list[Assignment] = []
    for port in sorted(table):
        assignment = table[port]
        if port in kept:
            continue
        service = (assignment.namespace, assignment.name)
        if service not in services:
            if len(services) >= max_services:
                over.append(assignment)
                continue
            services.add(service)
        opened.append((port, assignment))
    return ListenPlan(close=close, open=tuple(opened), over=tuple(over))


def should_request_wake(status: ActivationStatus, held: int) -> bool:
    """A wake is asked for while requests are held (``held``, after those that cannot be served were
    answered) and none is pending (asked for and not answered)."""
    return held > 0 and not status.wake_pending


def wake_patch(now: float, resource_version: str) -> dict[str, Any]:
    """The merge patch of the ModelService's status subresource that asks for a wake, with the
    ``resourceVersion`` read as its precondition."""
    return {
        "metadata": {"resourceVersion": resource_version},
        "status": {"lifecycle": {"wakeRequestedAt": durations.format_time(now)}},
    }


DEFAULT_ROUTER_PORT = 8080
"""The router's traffic port on a model pod (``spec.router.port``), as the chart sets it: the
activator asks its ``/readyz`` there (the router answers it on its traffic port as on its admin
port, so the activator needs no way into the admin port) and relays the held requests to it."""


def _time(value: Any) -> float | None:
    if not isinstance(value, str):
        return None
    try:
        return durations.parse_time(value)
    except ValueError:
        return None


def activation_status(status: Any) -> ActivationStatus:
    """The activation part of a ModelService's ``status`` (``status.lifecycle``), as the controller
    writes it; a field missing or malformed is absent (a new service has no lifecycle yet)."""
    lifecycle = status.get("lifecycle") if isinstance(status, dict) else None
    if not isinstance(lifecycle, dict):
        return ActivationStatus()
    try:
        phase = Phase(lifecycle.get("phase", Phase.ACTIVE.value))
    except ValueError:
        phase = Phase.ACTIVE
    cold = lifecycle.get("coldStartSeconds")
    replicas = lifecycle.get("replicasBeforeZero")
    return ActivationStatus(
        phase=phase,
        replicas_before_zero=replicas if isinstance(replicas, int) and not isinstance(replicas, bool) else None,
        wake_requested_at=_time(lifecycle.get("wakeRequestedAt")),
        awoken_at=_time(lifecycle.get("awokenAt")),
        cold_start_seconds=float(cold) if isinstance(cold, int | float) and not isinstance(cold, bool) else None,
    )


def label_selector(spec: Any) -> str | None:
    """``spec.podSelector.matchLabels`` as a ``labelSelector`` query value (sorted), or None when the
    service selects its pods by labels the activator cannot list by (none, or expressions only)."""
    selector = spec.get("podSelector") if isinstance(spec, dict) else None
    labels = selector.get("matchLabels") if isinstance(selector, dict) else None
    if not isinstance(labels, dict) or not labels:
        return None
    return ",".join(f"{key}={value}" for key, value in sorted(labels.items()))


def router_port(spec: Any) -> int:
    """The model pods' router traffic port (``spec.router.port``; the default when absent or not a port)."""
    router = spec.get("router") if isinstance(spec, dict) else None
    router = router if isinstance(router, dict) else {}
    return _port(router.get("port", DEFAULT_ROUTER_PORT), DEFAULT_ROUTER_PORT)


def router_grpc_port(spec: Any) -> int | None:
    """The model pods' router gRPC port (``spec.router.grpcPort``; None when absent or not a port: the
    service takes no gRPC calls, and the activator answers them UNAVAILABLE rather than hold them)."""
    router = spec.get("router") if isinstance(spec, dict) else None
    value = router.get("grpcPort") if isinstance(router, dict) else None
    return _port(value, 0) or None


def _port(value: Any, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 < value < 65536 else default


def candidate_pods(pods: Any) -> list[str]:
    """The IPs of the listed pods whose router may answer ready (Running, an IP, not being deleted),
    oldest first (the one most likely warmed up; ties by name)."""
    items = pods.get("items") if isinstance(pods, dict) else None
    found: list[tuple[str, str, str]] = []
    for pod in items if isinstance(items, list) else []:
        meta, status = pod.get("metadata") or {}, pod.get("status") or {}
        ip = status.get("podIP")
        if status.get("phase") != "Running" or not ip or meta.get("deletionTimestamp"):
            continue
        found.append((str(meta.get("creationTimestamp") or ""), str(meta.get("name") or ""), str(ip)))
    return [ip for _, _, ip in sorted(found)]
