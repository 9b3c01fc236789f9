"""The ownership rule as a table (``tests/cases/ownership/``): which objects a ModelService may have
the controller write, and which selected pods are its own. The operator-level tests of the same rule
are in ``test_operator_ownership.py``; every controller test's emulator audits every write."""

from __future__ import annotations

from typing import Any

import pytest

from drain_router.decisions import ownership
from tests import casefiles

OWNER = ownership.Owner(namespace="ns", name="llama", uid="uid-msvc")


def _refs(rows: list[dict[str, Any]] | None) -> tuple[ownership.OwnerRef, ...]:
    return tuple(
        ownership.OwnerRef(
            api_version=r["apiVersion"],
            kind=r["kind"],
            name=r["name"],
            uid=r["uid"],
            controller=r.get("controller", True),
        )
        for r in rows or ()
    )


@pytest.mark.parametrize("row", casefiles.params(casefiles.load("ownership/check.yaml")))
def test_check(row: dict[str, Any]) -> None:
    claim = ownership.Claim(
        kind=row.get("kind", "Service"),
        namespace=row.get("namespace", "ns"),
        name="x",
        uid="uid-x",
        resource_version="7",
        labels=row.get("labels") or {},
        owner_refs=_refs(row.get("ownerRefs")),
    )
    verdict = ownership.check(OWNER, claim)
    if isinstance(verdict, ownership.Consent):
        assert verdict.how.value == row["expect"]
        assert (verdict.namespace, verdict.name, verdict.uid, verdict.resource_version) == ("ns", "x", "uid-x", "7")
        assert verdict.service == OWNER and verdict.kind == claim.kind
    else:
        assert verdict.refusal.value == row["expect"]
        assert str(verdict) == f"Service/x: {row['expect']}"


DEPLOYMENT_REF = [{"apiVersion": "apps/v1", "kind": "Deployment", "name": "llama", "uid": "uid-d"}]
RS_REF = [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "llama-rs", "uid": "uid-rs"}]


@pytest.mark.parametrize("row", casefiles.params(casefiles.load("ownership/pods.yaml")))
def test_check_pod(row: dict[str, Any]) -> None:
    labels = {ownership.SERVICE_LABEL: "llama"} if row.get("deploymentOwned", True) else {}
    deployment = ownership.check(
        OWNER, ownership.Claim(kind="Deployment", namespace="ns", name="llama", uid="uid-d", labels=labels)
    )
    deployments = (deployment,) if isinstance(deployment, ownership.Consent) else ()
    rs_refs = row.get("rs", DEPLOYMENT_REF)
    replicasets = (
        {}
        if rs_refs is None
        else {
            "llama-rs": ownership.Claim(
                kind="ReplicaSet", namespace="ns", name="llama-rs", uid="uid-rs", owner_refs=_refs(rs_refs)
            )
        }
    )
    pod = ownership.Claim(
        kind="Pod",
        namespace=row.get("podNamespace", "ns"),
        name="llama-rs-abcde",
        uid="uid-pod",
        owner_refs=_refs(row.get("pod", RS_REF)),
    )
    verdict = ownership.check_pod(OWNER, pod, replicasets, deployments)
    if row["expect"] == "owned":
        assert isinstance(verdict, ownership.Consent) and verdict.how is ownership.How.REPLICASET
        assert (verdict.kind, verdict.name, verdict.uid) == ("Pod", "llama-rs-abcde", "uid-pod")
    else:
        assert isinstance(verdict, ownership.NotOwned), verdict


def test_a_consent_for_another_service_proves_nothing_for_a_pod() -> None:
    """A Deployment consent given to another ModelService does not make this one's pods its own."""
    other = ownership.Owner(namespace="ns", name="other", uid="uid-other")
    deployment = ownership.check(
        other,
        ownership.Claim(
            kind="Deployment", namespace="ns", name="llama", uid="uid-d", labels={ownership.SERVICE_LABEL: "other"}
        ),
    )
    assert isinstance(deployment, ownership.Consent)
    rs = ownership.Claim(
        kind="ReplicaSet", namespace="ns", name="llama-rs", uid="uid-rs", owner_refs=_refs(DEPLOYMENT_REF)
    )
    pod = ownership.Claim(kind="Pod", namespace="ns", name="p", uid="uid-p", owner_refs=_refs(RS_REF))
    assert isinstance(ownership.check_pod(OWNER, pod, {"llama-rs": rs}, (deployment,)), ownership.NotOwned)


def test_itself() -> None:
    consent = ownership.itself(OWNER)
    assert (consent.kind, consent.name, consent.uid, consent.how) == (
        "ModelService",
        "llama",
        "uid-msvc",
        ownership.How.ITSELF,
    )
