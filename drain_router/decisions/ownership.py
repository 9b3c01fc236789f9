"""Which objects a ModelService may have the controller delete, scale, evict, force-delete or patch.

Purely computational, no side effects. The rule, in one place: the controller writes an object only
when the object itself says it belongs to the ModelService, in the ModelService's namespace:

- the label ``drainrouter.dev/service`` with the ModelService's name, or
- an owner reference to the ModelService (its group, kind, name and uid);
- a pod, only through its controller: a ReplicaSet whose controller is a Deployment the ModelService
  owns by one of the two above (uids checked at each link).

A label or an owner reference on the target is consent given by whoever may change the target.
Nothing written on the ModelService alone (its ``spec.workload``, ``spec.route``, ``spec.podSelector``)
grants it: anyone who may create a ModelService could otherwise have the controller delete what they
could not delete themselves.

The proof is a :class:`Consent`. It is made here and nowhere else; every write method of the
controller's API client takes one and writes only the object it names, with its ``uid`` (and, where
the write allows, its ``resourceVersion``) as a precondition, so a replacement under the same name,
or an object changed since it was read, is not written either.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable, Mapping

SERVICE_LABEL = "drainrouter.dev/service"
"""The label an object carries to say which ModelService it belongs to (its value: the name)."""

GROUP = "drainrouter.dev"
KIND = "ModelService"
REPLICASET = ("apps", "ReplicaSet")
DEPLOYMENT = ("apps", "Deployment")


class How(enum.StrEnum):
    """How an object proved that it belongs to the ModelService."""

    LABEL = "label"
    OWNER_REFERENCE = "ownerReference"
    REPLICASET = "ReplicaSet of an owned Deployment"
    ITSELF = "the ModelService itself"
    CREATED = "created for the ModelService, labelled for it and owned by it"


class Refusal(enum.StrEnum):
    """Why an object named by the ModelService is not its to write."""

    OTHER_NAMESPACE = "in another namespace"
    OTHER_SERVICE = "labelled for another service"
    NO_CLAIM = "neither labelled for this service nor owned by it"
    NOT_THROUGH_OWNED_DEPLOYMENT = "not owned through a ReplicaSet by a Deployment this service owns"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Owner:
    """The ModelService, as its own metadata says."""

    namespace: str
    name: str
    uid: str


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class OwnerRef:
    """One entry of ``metadata.ownerReferences``."""

    api_version: str
    kind: str
    name: str
    uid: str
    controller: bool = False

    @property
    def group(self) -> str:
        return self.api_version.rpartition("/")[0]


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Claim:
    """What an object says about itself: who it is and whom it belongs to."""

    kind: str
    namespace: str | None
    name: str
    uid: str
    resource_version: str | None = None
    labels: Mapping[str, str] = dataclasses.field(default_factory=dict)
    owner_refs: tuple[OwnerRef, ...] = ()

    def controller_ref(self) -> OwnerRef | None:
        return next((r for r in self.owner_refs if r.controller), None)

    def __str__(self) -> str:
        return f"{self.kind}/{self.name}"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Consent:
    """The proof that the controller may write one object for one ModelService. Made only by
    :func:`check`, :func:`check_pod` and :func:`itself`; the API client writes nothing without one."""

    service: Owner
    kind: str
    namespace: str
    name: str
    uid: str
    resource_version: str | None
    """As read: the writes that allow it (deletes, merge patches) are conditional on it."""
    how: How


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class NotOwned:
    """An object the ModelService names but does not own: left alone, reported, warned about once."""

    what: str
    """``Kind/name``."""
    refusal: Refusal

    def __str__(self) -> str:
        return f"{self.what}: {self.refusal.value}"


def _refers_to(ref: OwnerRef, owner: Owner) -> bool:
    return ref.group == GROUP and ref.kind == KIND and ref.name == owner.name and ref.uid == owner.uid


def _consent(owner: Owner, claim: Claim, how: How) -> Consent:
    return Consent(
        service=owner,
        kind=claim.kind,
        namespace=owner.namespace,
        name=claim.name,
        uid=claim.uid,
        resource_version=claim.resource_version,
        how=how,
    )


def check(owner: Owner, claim: Claim) -> Consent | NotOwned:
    """Whether ``claim``'s object belongs to ``owner``. Purely computational function with no side
    effects. The label wins over an owner reference only in naming the proof; either suffices, and
    a label naming another service refuses even with an owner reference (the object says both)."""
    if claim.namespace != owner.namespace:
        return NotOwned(what=str(claim), refusal=Refusal.OTHER_NAMESPACE)
    label = claim.labels.get(SERVICE_LABEL)
    if label is not None and label != owner.name:
        return NotOwned(what=str(claim), refusal=Refusal.OTHER_SERVICE)
    if label == owner.name:
        return _consent(owner, claim, How.LABEL)
    if any(_refers_to(ref, owner) for ref in claim.owner_refs):
        return _consent(owner, claim, How.OWNER_REFERENCE)
    return NotOwned(what=str(claim), refusal=Refusal.NO_CLAIM)


def _controlled_by(claim: Claim, kind: tuple[str, str], owner: Claim) -> bool:
    ref = claim.controller_ref()
    return (
        ref is not None
        and (ref.group, ref.kind) == kind
        and ref.name == owner.name
        and ref.uid == owner.uid
        and claim.namespace == owner.namespace
    )


def check_pod(
    owner: Owner, pod: Claim, replicasets: Mapping[str, Claim], deployments: Iterable[Consent]
) -> Consent | NotOwned:
    """Whether a selected pod belongs to ``owner``: its controller is a ReplicaSet (``replicasets``,
    by name, as read) whose controller is one of ``deployments`` (Deployments ``owner`` owns, their
    consents from :func:`check`). Purely computational function with no side effects."""
    if pod.namespace != owner.namespace:
        return NotOwned(what=str(pod), refusal=Refusal.OTHER_NAMESPACE)
    ref = pod.controller_ref()
    rs = None if ref is None or (ref.group, ref.kind) != REPLICASET else replicasets.get(ref.name)
    if rs is not None and _controlled_by(pod, REPLICASET, rs):
        for deployment in deployments:
            if (
                deployment.service == owner
                and deployment.kind == DEPLOYMENT[1]
                and _controlled_by(rs, DEPLOYMENT, _as_claim(deployment))
            ):
                return _consent(owner, pod, How.REPLICASET)
    return NotOwned(what=str(pod), refusal=Refusal.NOT_THROUGH_OWNED_DEPLOYMENT)


def _as_claim(consent: Consent) -> Claim:
    return Claim(kind=DEPLOYMENT[1], namespace=consent.namespace, name=consent.name, uid=consent.uid)


def itself(owner: Owner) -> Consent:
    """The ModelService's own consent to be deleted (its rule ``DeleteSelf``)."""
    return Consent(
        service=owner,
        kind=KIND,
        namespace=owner.namespace,
        name=owner.name,
        uid=owner.uid,
        resource_version=None,
        how=How.ITSELF,
    )


def to_create(owner: Owner, kind: str, name: str) -> Consent:
    """The consent to create ``kind``/``name`` in the ModelService's namespace for it (an activator
    EndpointSlice): the API client creates it only carrying the label and an owner reference to
    ``owner``, so it is the service's by the rule above from its first moment."""
    return Consent(
        service=owner,
        kind=kind,
        namespace=owner.namespace,
        name=name,
        uid="",
        resource_version=None,
        how=How.CREATED,
    )
