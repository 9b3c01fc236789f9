"""Staged deletion of a ModelService: the route goes first, then the workload, then the pods.

Rule of this package: purely computational, no side effects. :func:`next_stage` takes the persisted
status, what the caller observed in the cluster, the resolved knobs and ``now`` (Unix seconds), and
returns a :class:`Decision`. The caller writes ``decision.status`` first, then carries out
``decision.actions``, then posts ``decision.events``, then requeues or releases the finalizer.
Nothing here reads a clock or a raw API dict (``drain_router.controller.kube.observe`` parses those).

Stages only move forward::

    (start) -> RouteRemoving -> RouteSettling -> Uninstalling -> PodsTerminating -> ForceDeleting -> Released
            \\-- no route (NoRoute) --------------^      ^-- route still there at the deadline (RouteStuck)

Only the stage and timestamps carry meaning across passes (``startedAt``, ``routeRemovedAt``,
``uninstalledAt``), so a restarted controller resumes on the same clock; everything else in the status
is recomputed from observations on every pass.

Modules, each importable on its own; this facade re-exports their public names:
``enums`` (stages, outcomes, reasons, verdicts), ``refs`` (object references, the typed spec, the
route lookup), ``knobs`` (annotation > spec > default), ``observations``, ``pods`` (which pods still
count), ``status`` (``status.deletion`` and its wire format), ``conditions`` (the ``Deleting``
condition), ``decision`` (what a pass returns), ``transitions`` (a pass's inputs, what a stage
returns, the moves the stages share) and ``stages`` (the state machine: one function per stage, the
driver).
"""

from drain_router.decisions.deletion.conditions import CONDITION_TYPE, condition_for
from drain_router.decisions.deletion.decision import Action, Decision
from drain_router.decisions.deletion.enums import ActionKind, Outcome, Reason, Stage, Subject, Verdict
from drain_router.decisions.deletion.knobs import (
    ANNOTATION_DELETION_POLICY,
    ANNOTATION_FORCE_DELETE_AFTER,
    ANNOTATION_MAX_WAIT,
    ANNOTATION_ROUTE_SETTLE,
    DEFAULT_MAX_WAIT_SECS,
    DEFAULT_ROUTE_SETTLE_SECS,
    DeletionSpec,
    InvalidKnob,
    KnobResolution,
    Knobs,
    resolve_knobs,
)
from drain_router.decisions.deletion.observations import (
    ApiFailure,
    FailedRead,
    ObjectObservation,
    Observations,
)
from drain_router.decisions.deletion.pods import (
    POD_GONE_AFTER_GRACE_SECS,
    PodCount,
    PodEntry,
    count_pods,
    pods_message,
)
from drain_router.decisions.deletion.refs import (
    GATEWAY_GROUP,
    GROUP,
    INFERENCE_GROUP,
    ROUTE_KINDS,
    SERVICE_LABEL,
    ObjectRef,
    ServiceSpec,
    find_route,
    is_route_kind,
)
from drain_router.decisions.deletion.stages import next_stage
from drain_router.decisions.deletion.status import MAX_LISTED_PODS, DeletionStatus
from drain_router.decisions.deletion.transitions import Advance, Pass, Stop

__all__ = [
    "ANNOTATION_DELETION_POLICY",
    "ANNOTATION_FORCE_DELETE_AFTER",
    "ANNOTATION_MAX_WAIT",
    "ANNOTATION_ROUTE_SETTLE",
    "CONDITION_TYPE",
    "DEFAULT_MAX_WAIT_SECS",
    "DEFAULT_ROUTE_SETTLE_SECS",
    "GATEWAY_GROUP",
    "GROUP",
    "INFERENCE_GROUP",
    "MAX_LISTED_PODS",
    "POD_GONE_AFTER_GRACE_SECS",
    "ROUTE_KINDS",
    "SERVICE_LABEL",
    "Action",
    "ActionKind",
    "Advance",
    "ApiFailure",
    "Decision",
    "DeletionSpec",
    "DeletionStatus",
    "FailedRead",
    "InvalidKnob",
    "KnobResolution",
    "Knobs",
    "ObjectObservation",
    "ObjectRef",
    "Observations",
    "Outcome",
    "Pass",
    "PodCount",
    "PodEntry",
    "Reason",
    "ServiceSpec",
    "Stage",
    "Stop",
    "Subject",
    "Verdict",
    "condition_for",
    "count_pods",
    "find_route",
    "is_route_kind",
    "next_stage",
    "pods_message",
    "resolve_knobs",
]
