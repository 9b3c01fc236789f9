"""Pointing a ModelService's route (``spec.route``, an HTTPRoute or a GRPCRoute) at the activator and
back. Purely computational, no side effects: the controller reads the route, asks :func:`classify`
where it points, and sends the merge patch :func:`to_activator` or :func:`to_service` builds.

- **To the activator**: every rule's ``backendRefs`` become the activator's Service alone, and the rule
  gets a ``RequestHeaderModifier`` that sets ``x-drain-router-service: <namespace>/<name>`` (merged
  into the rule's own ``RequestHeaderModifier`` when it has one: Gateway API allows one per rule).
  Each rule's original ``backendRefs`` and ``filters`` are kept on the route, in the annotation
  :data:`ANNOTATION` (JSON, one entry per rule), so the switch back restores them exactly.
- **To the model Service**: each rule gets its saved ``backendRefs`` and ``filters`` back, and the
  annotation goes.

Every patch carries the ``resourceVersion`` the route was read at: a route changed since (a person, a
Helm upgrade) answers 409 and the next pass reads and decides again.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping
from typing import Any

from drain_router.decisions.activation import Route

ANNOTATION = "drainrouter.dev/backend-refs"
"""The route's original ``[{backendRefs, filters}, ...]``, one per rule, while it points at the activator."""
HEADER = "x-drain-router-service"
_MODIFIER = "RequestHeaderModifier"
_LABEL = r"[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?"
_SERVICE = re.compile(rf"(?P<namespace>{_LABEL})/(?P<name>{_LABEL}):(?P<port>[0-9]{{1,5}})(?:,(?P<grpc>[0-9]{{1,5}}))?")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ActivatorService:
    """The activator's Service (``--activator-service <namespace>/<name>:<port>[,<grpcPort>]``)."""

    namespace: str
    name: str
    port: int
    grpc_port: int | None = None
    """Its gRPC (h2c) port, where a GRPCRoute points (None: every route at :attr:`port`)."""

    def __str__(self) -> str:
        grpc = "" if self.grpc_port is None else f",{self.grpc_port}"
        return f"{self.namespace}/{self.name}:{self.port}{grpc}"

    def backend_ref(self, route_kind: str = "HTTPRoute") -> dict[str, Any]:
        """The ``backendRef`` of a route of this kind: a GRPCRoute's at the gRPC port when there is one."""
        port = self.grpc_port if route_kind == "GRPCRoute" and self.grpc_port is not None else self.port
        return {"group": "", "kind": "Service", "name": self.name, "namespace": self.namespace, "port": port}


def parse_activator_service(text: str) -> ActivatorService:
    """``<namespace>/<name>:<port>[,<grpcPort>]`` (a Service's namespace and name are DNS-1123 labels,
    the ports 1..65535); ``ValueError`` saying what is wrong otherwise."""
    match = _SERVICE.fullmatch(text.strip())
    if match is None:
        raise ValueError(
            f"{text!r} is not <namespace>/<name>:<port>[,<grpcPort>] (namespace and name DNS-1123 labels, "
            "e.g. drain-router/drain-router-activator:8080 or ...:8080,8081)"
        )
    port, grpc = int(match["port"]), None if match["grpc"] is None else int(match["grpc"])
    for value in (port, grpc):
        if value is not None and not 1 <= value <= 65535:
            raise ValueError(f"{text!r}: port {value} is not in 1..65535")
    return ActivatorService(namespace=match["namespace"], name=match["name"], port=port, grpc_port=grpc)


def _rules(route: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [dict(r) for r in (route.get("spec") or {}).get("rules") or () if isinstance(r, Mapping)]


def _at_activator(ref: Mapping[str, Any], activator: ActivatorService, route_namespace: str) -> bool:
    return (
        ref.get("name") == activator.name
        and (ref.get("namespace") or route_namespace) == activator.namespace
        and (ref.get("kind") or "Service") == "Service"
        and (ref.get("group") or "") == ""
    )


def saved(route: Mapping[str, Any]) -> list[dict[str, Any]] | None:
    """The annotation's saved rules, ``None`` when absent or unreadable."""
    text = ((route.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION)
    if text is None:
        return None
    try:
        data = json.loads(text)
    except (ValueError, TypeError):
        return None
    if not isinstance(data, list) or not all(isinstance(d, dict) for d in data):
        return None
    return data


def classify(route: Mapping[str, Any], activator: ActivatorService) -> Route:
    """Where the route points: :attr:`Route.ACTIVATOR` when every rule's backendRefs are the
    activator alone and the originals are saved; :attr:`Route.SERVICE` when no rule names the
    activator (a stale annotation, e.g. after a Helm upgrade restored the rules, is ignored);
    :attr:`Route.UNKNOWN` for anything else (no rules, some rules at the activator, the originals lost
    or saved for another number of rules): nothing is switched on a route of unknown shape."""
    rules = _rules(route)
    if not rules:
        return Route.UNKNOWN
    namespace = (route.get("metadata") or {}).get("namespace") or ""
    refs = [list(r.get("backendRefs") or ()) for r in rules]
    if not any(_at_activator(ref, activator, namespace) for each in refs for ref in each):
        return Route.SERVICE
    if all(len(each) == 1 and _at_activator(each[0], activator, namespace) for each in refs):
        kept = saved(route)
        return Route.ACTIVATOR if kept is not None and len(kept) == len(rules) else Route.UNKNOWN
    return Route.UNKNOWN


def _with_header(filters: list[Any], value: str) -> list[Any]:
    header = {"name": HEADER, "value": value}
    out, merged = [], False
    for f in filters:
        if isinstance(f, Mapping) and f.get("type") == _MODIFIER and not merged:
            modifier = dict(f.get("requestHeaderModifier") or {})
            sets = [s for s in modifier.get("set") or () if str(s.get("name", "")).lower() != HEADER]
            remove = [r for r in modifier.get("remove") or () if str(r).lower() != HEADER]
            modifier["set"] = [*sets, header]
            modifier["remove"] = remove or None
            out.append({**f, "requestHeaderModifier": {k: v for k, v in modifier.items() if v is not None}})
            merged = True
        else:
            out.append(f)
    if not merged:
        out.append({"type": _MODIFIER, "requestHeaderModifier": {"set": [header]}})
    return out


def to_activator(route: Mapping[str, Any], activator: ActivatorService, service: str) -> dict[str, Any]:
    """The merge patch that points every rule at the activator with the header naming ``service``
    (``<namespace>/<name>``), the originals saved in :data:`ANNOTATION`."""
    rules = _rules(route)
    kept = [{k: r[k] for k in ("backendRefs", "filters") if k in r} for r in rules]
    ref = activator.backend_ref(str(route.get("kind") or ""))  # (a GRPCRoute: the activator's gRPC port)
    switched = [
        {**r, "backendRefs": [ref], "filters": _with_header(list(r.get("filters") or ()), service)} for r in rules
    ]
    return _patch(route, switched, json.dumps(kept, separators=(",", ":"), sort_keys=True))


def to_service(route: Mapping[str, Any]) -> dict[str, Any]:
    """The merge patch that gives every rule its saved ``backendRefs`` and ``filters`` back and drops
    the annotation. Only for a route :func:`classify` called :attr:`Route.ACTIVATOR`."""
    rules, kept = _rules(route), saved(route)
    if kept is None or len(kept) != len(rules):
        raise ValueError("the route's saved backendRefs are missing or do not match its rules")
    restored = []
    for rule, original in zip(rules, kept):
        rule = {k: v for k, v in rule.items() if k not in ("backendRefs", "filters")}
        restored.append({**rule, **original})
    return _patch(route, restored, None)


def _patch(route: Mapping[str, Any], rules: list[dict[str, Any]], annotation: str | None) -> dict[str, Any]:
    metadata: dict[str, Any] = {"annotations": {ANNOTATION: annotation}}
    version = (route.get("metadata") or {}).get("resourceVersion")
    if version is not None:
        metadata["resourceVersion"] = version
    return {"metadata": metadata, "spec": {"rules": rules}}
