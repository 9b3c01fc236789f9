"""What the controller saw in the cluster on one pass, as the state machine reads it.

Purely computational, no side effects: frozen values built by ``drain_router.controller.kube.observe``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from drain_router.decisions import ownership
from drain_router.decisions.deletion.enums import Subject
from drain_router.decisions.deletion.refs import ObjectRef
from drain_router.decisions.objects import Pod


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ApiFailure:
    """An API call that did not get the answer it needed: a read that failed (403, 500, a kind the
    server does not serve) or an action that was refused. Data, not an exception: the state machine
    decides what it means."""

    call: str
    """The call, named as an operator would look it up: ``GET gateway.networking.k8s.io/v1 httproutes/llama``."""
    code: int | None
    """The HTTP status; ``None`` when there was no answer or the call could not be made."""
    message: str
    """The API server's ``Status`` message, or what went wrong without one."""

    def __str__(self) -> str:
        return f"{self.call}: {self.message}" if self.code is None else f"{self.call}: {self.code} {self.message}"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class FailedRead:
    subject: Subject
    failure: ApiFailure


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ObjectObservation:
    ref: ObjectRef
    exists: bool
    """``True`` also when the read failed (see ``Observations.failed_reads``): unknown is never "gone"."""
    deleting: bool = False
    """Has a deletionTimestamp: counts as deleted (we asked, or someone did)."""
    service_label: str | None = None
    """Value of the ``drainrouter.dev/service`` label, if any."""
    verdict: ownership.Consent | ownership.NotOwned | None = None
    """The ownership check of the object as read (:func:`ownership.check`); ``None`` when it was not
    read (absent, or the read failed): nothing is written without a :class:`ownership.Consent`."""

    def foreign_to(self, service: str) -> bool:
        return self.exists and self.service_label is not None and self.service_label != service

    @property
    def owned(self) -> bool:
        return isinstance(self.verdict, ownership.Consent)

    @property
    def not_owned(self) -> ownership.NotOwned | None:
        """Why an existing object is not the service's to write, ``None`` when it is (or is unknown)."""
        return self.verdict if self.exists and isinstance(self.verdict, ownership.NotOwned) else None


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Observations:
    service: str
    """The ModelService's name (foreign checks)."""
    suspend: bool = False
    route: ObjectObservation | None = None
    """``None``: no route configured (NoRoute)."""
    workload: tuple[ObjectObservation, ...] = ()
    pods: tuple[Pod, ...] = ()
    """Pods matching ``spec.podSelector`` in the namespace that the service owns (through a
    ReplicaSet of a Deployment it owns), any phase. Selected pods it does not own are not here: never
    waited for, never force-deleted."""
    ignored_pods: tuple[ownership.NotOwned, ...] = ()
    """Pods the selector selects that the service does not own (reported, never counted)."""
    nodes: Mapping[str, bool] = dataclasses.field(default_factory=dict)
    """Node name -> Ready, for the nodes of the listed pods. A name not here is a missing node."""
    failed_reads: tuple[FailedRead, ...] = ()
    """Reads of this pass that failed; a stage that needs one of their subjects cannot move on."""
    failed_actions: tuple[ApiFailure, ...] = ()
    """Actions of the previous pass that failed (retried if still needed; named when time runs out)."""

    def unowned(self) -> tuple[ownership.NotOwned, ...]:
        """The route and workload objects that exist but are not the service's, in spec order."""
        found = (o.not_owned for o in (self.route, *self.workload) if o is not None)
        return tuple(dict.fromkeys(n for n in found if n is not None))

    def unread(self, *subjects: Subject) -> tuple[ApiFailure, ...]:
        return tuple(f.failure for f in self.failed_reads if f.subject in subjects)
