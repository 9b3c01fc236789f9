"""The ModelService admission cases of ``tests/cases/crd/admission.yaml`` as request bodies: the same
objects go to the emulator (``test_emulator.py``) and to the real API server
(``e2e/kubernetes/test_crd.py``), and both answers are held to the file's ``causes``."""

from __future__ import annotations

import copy
from typing import Any

from drain_router.controller import crd
from tests import casefiles

CASES: list[dict[str, Any]] = casefiles.load("crd/admission.yaml")


def valid_body(name: str, namespace: str, labels: dict[str, str], **spec: Any) -> dict[str, Any]:
    """A ModelService the CRD accepts (its pods by ``labels``, a Deployment named ``name``), with
    ``spec`` merged over its spec."""
    return {
        "apiVersion": f"{crd.group()}/{crd.version()}",
        "kind": crd.kind(),
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "podSelector": {"matchLabels": dict(labels)},
            "workload": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": name}],
            **copy.deepcopy(spec),
        },
    }


def body(case: dict[str, Any], name: str, namespace: str, labels: dict[str, str]) -> dict[str, Any]:
    """The case's object: its ``spec`` merged over a valid one, its ``without`` paths removed."""
    obj = valid_body(name, namespace, labels, **case.get("spec", {}))
    for dotted in case.get("without", ()):
        *parents, last = dotted.split(".")
        where = obj
        for key in parents:
            where = where[key]
        del where[last]
    return obj


def by_field(causes: list[dict[str, str]]) -> list[tuple[str, str, str]]:
    """Causes in a stable order, to compare answers whose order may differ."""
    return sorted((c.get("field", ""), c["reason"], c["message"]) for c in causes)
