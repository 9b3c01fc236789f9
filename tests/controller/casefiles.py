"""Turn the YAML case files under ``tests/cases/deletion/`` into the pure function's inputs."""

from __future__ import annotations

from typing import Any

from drain_router.controller.kube import observe
from drain_router.decisions import deletion, durations, objects, ownership
from tests import casefiles

SERVICE = "llama"


def load_dir(sub: str) -> list[Any]:
    """One case per file in ``tests/cases/deletion/<sub>/``."""
    files = sorted((casefiles.CASES / "deletion" / sub).glob("*.yaml"))
    return casefiles.params([casefiles.load(f"deletion/{sub}/{path.name}") for path in files])


def load_table(name: str) -> list[Any]:
    """One case per row of ``tests/cases/deletion/helpers/<name>``."""
    return casefiles.params(casefiles.load(f"deletion/helpers/{name}"))


def t(value: str | None) -> float | None:
    return None if value is None else durations.parse_time(value)


OWNER = ownership.Owner(namespace="ns", name=SERVICE, uid="uid-msvc")


def object_observation(data: dict[str, Any]) -> deletion.ObjectObservation:
    """An object of a case: the service's (labelled for it) unless the case says ``owned: false`` or
    gives it another ``serviceLabel``."""
    ref = observe.object_ref(data)
    label = data.get("serviceLabel")
    if label is None and data.get("owned", True):
        label = SERVICE
    claim = ownership.Claim(
        kind=ref.kind,
        namespace=OWNER.namespace,
        name=ref.name,
        uid=f"uid-{ref.name}",
        labels={} if label is None else {ownership.SERVICE_LABEL: label},
    )
    return deletion.ObjectObservation(
        ref=ref,
        exists=data["exists"],
        deleting=data.get("deleting", False),
        service_label=label,
        verdict=ownership.check(OWNER, claim) if data["exists"] else None,
    )


def pod_observation(data: dict[str, Any]) -> objects.Pod:
    return objects.Pod(
        name=data["name"],
        uid=data.get("uid", f"uid-{data['name']}"),
        phase=data.get("phase", "Running"),
        node=data.get("node"),
        deletion_timestamp=t(data.get("deletionTimestamp")),
        grace=data.get("grace"),
    )


def observations(data: dict[str, Any]) -> deletion.Observations:
    route = data.get("route")
    return deletion.Observations(
        service=data.get("service", SERVICE),
        suspend=data.get("suspend", False),
        route=None if route is None else object_observation(route),
        workload=tuple(object_observation(o) for o in data.get("workload", ())),
        pods=tuple(pod_observation(p) for p in data.get("pods", ())),
        nodes=data.get("nodes", {}),
    )


def action_dict(action: deletion.Action) -> dict[str, Any]:
    if action.kind is deletion.ActionKind.FORCE_DELETE_POD:
        return {"kind": action.kind.value, "pod": action.pod, "uid": action.uid}
    return {"kind": action.kind.value, "ref": str(action.ref)}
