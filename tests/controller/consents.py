"""Consents for the tests that call the API client directly, made the one way the controller makes
them: :mod:`drain_router.decisions.ownership` checking what an object says about itself."""

from __future__ import annotations

from typing import Any

from drain_router.controller.kube import observe
from drain_router.decisions import ownership

from .conftest import NAMESPACE

OWNER = ownership.Owner(namespace=NAMESPACE, name="llama", uid="uid-msvc")


def of(kind: str, obj: dict[str, Any], owner: ownership.Owner = OWNER) -> ownership.Consent:
    """The consent of an object as read (it must say it is ``owner``'s)."""
    verdict = ownership.check(owner, observe.claim(kind, obj))
    assert isinstance(verdict, ownership.Consent), verdict
    return verdict


def labelled(kind: str, name: str, uid: str, resource_version: str | None = None) -> ownership.Consent:
    """The consent of an object labelled for :data:`OWNER` with this name and uid."""
    meta = {"name": name, "namespace": NAMESPACE, "uid": uid, "labels": {ownership.SERVICE_LABEL: OWNER.name}}
    if resource_version is not None:
        meta["resourceVersion"] = resource_version
    return of(kind, {"metadata": meta})


def pod(name: str, uid: str) -> ownership.Consent:
    """A pod's consent, through a ReplicaSet of a Deployment labelled for :data:`OWNER`."""
    deployment = labelled("Deployment", "llama", "uid-deployment")
    link = ownership.OwnerRef(
        api_version="apps/v1", kind="Deployment", name="llama", uid=deployment.uid, controller=True
    )
    rs = ownership.Claim(kind="ReplicaSet", namespace=NAMESPACE, name="llama-rs", uid="uid-rs", owner_refs=(link,))
    ref = ownership.OwnerRef(api_version="apps/v1", kind="ReplicaSet", name=rs.name, uid=rs.uid, controller=True)
    claim = ownership.Claim(kind="Pod", namespace=NAMESPACE, name=name, uid=uid, owner_refs=(ref,))
    verdict = ownership.check_pod(OWNER, claim, {rs.name: rs}, (deployment,))
    assert isinstance(verdict, ownership.Consent), verdict
    return verdict
