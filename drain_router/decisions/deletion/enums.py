"""The names of the staged deletion: stages, outcomes, reasons, verdicts and action kinds.

Purely computational, no side effects: string enums whose values are what the API sees.
"""

from __future__ import annotations

import enum


class Stage(str, enum.Enum):
    """``status.deletion.stage``, in the only order a deletion moves through them."""

    ROUTE_REMOVING = "RouteRemoving"
    ROUTE_SETTLING = "RouteSettling"
    UNINSTALLING = "Uninstalling"
    PODS_TERMINATING = "PodsTerminating"
    FORCE_DELETING = "ForceDeleting"
    RELEASED = "Released"


class Outcome(str, enum.Enum):
    """``status.deletion.outcome``: how the teardown went (kept once set, until Released)."""

    CLEAN = "Clean"
    NO_ROUTE = "NoRoute"
    ROUTE_STUCK = "RouteStuck"
    PODS_FORCE_DELETED = "PodsForceDeleted"
    TIMED_OUT = "TimedOut"


class Reason(enum.StrEnum):
    """Reasons of the ``Deleting`` condition and of the per-transition events."""

    STARTING = "Starting"
    """Not a stage: the reads needed to start (the foreign check) failed; the clock runs meanwhile."""
    ROUTE_REMOVING = "RouteRemoving"
    ROUTE_SETTLING = "RouteSettling"
    ROUTE_STUCK = "RouteStuck"
    NO_ROUTE = "NoRoute"
    UNINSTALLING = "Uninstalling"
    UNINSTALLED = "Uninstalled"
    WAITING_FOR_PODS = "WaitingForPods"
    PODS_FORCE_DELETED = "PodsForceDeleted"
    TIMED_OUT = "TimedOut"
    RELEASED = "Released"
    # Not stages: a pass that skips everything, and the warnings.
    ORPHANED = "Orphaned"
    FOREIGN_WORKLOAD = "ForeignWorkload"
    POD_FORCE_DELETED = "PodForceDeleted"
    INVALID_ANNOTATION = "InvalidAnnotation"
    INVALID_SPEC = "InvalidSpec"


class Verdict(str, enum.Enum):
    """What the caller does with the finalizer after a pass."""

    HOLD = "Hold"
    """``spec.suspend``: do nothing, keep the finalizer, look again later."""
    SKIP = "Skip"
    """Orphan policy or a foreign object: drop the finalizer without running (further) stages."""
    CONTINUE = "Continue"
    """Write the status, act, requeue."""
    RELEASE = "Release"
    """Write the status, drop the finalizer: the teardown is over."""


class Subject(str, enum.Enum):
    """What a failed read was about; each stage names the subjects it cannot decide without."""

    ROUTE = "route"
    WORKLOAD = "workload"
    PODS = "pods"
    NODES = "nodes"


class ActionKind(str, enum.Enum):
    DELETE_ROUTE = "DeleteRoute"
    DELETE_WORKLOAD = "DeleteWorkload"
    FORCE_DELETE_POD = "ForceDeletePod"
