"""Every ``drain_router_controller_*`` metric, in one place. Takes a registry so tests use a fresh one."""

from __future__ import annotations

import contextlib

from prometheus_client import CollectorRegistry, Counter, Gauge


class ControllerMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.tracing_spans_dropped = Counter(
            "drain_router_controller_tracing_spans_dropped_total",
            "Spans dropped because the export queue (OTEL_BSP_MAX_QUEUE_SIZE) was full (--tracing).",
            registry=registry,
        )
        self.deletion_transitions = Counter(
            "drain_router_controller_deletion_transitions_total",
            "Staged-deletion transitions, by the stage entered and the event reason.",
            ["stage", "reason"],
            registry=registry,
        )
        self.deletion_passes = Counter(
            "drain_router_controller_deletion_passes_total",
            "Staged-deletion passes, by verdict (Hold, Skip, Continue, Release).",
            ["verdict"],
            registry=registry,
        )
        self.deletions_finished = Counter(
            "drain_router_controller_deletions_finished_total",
            "ModelService teardowns that dropped their finalizer, by outcome (Orphaned/Foreign for skips).",
            ["outcome"],
            registry=registry,
        )
        self.pods_force_deleted = Counter(
            "drain_router_controller_pods_force_deleted_total",
            "Pods deleted with grace 0 after force-delete-after.",
            registry=registry,
        )
        self.pods_remaining = Gauge(
            "drain_router_controller_deletion_pods_remaining",
            "Pods still holding a ModelService's finalizer, at its last pass.",
            ["namespace", "name"],
            registry=registry,
        )
        self.action_errors = Counter(
            "drain_router_controller_action_errors_total",
            "API errors while carrying out a decision (retried on the next pass), by action.",
            ["action"],
            registry=registry,
        )
        self.recycle_held_pods = Gauge(
            "drain_router_controller_recycle_held_pods",
            "Pods past their maximum lifetime and not recycled (0 or 1: one candidate at a time), per ModelService.",
            ["namespace", "name"],
            registry=registry,
        )
        self.pods_recycled = Counter(
            "drain_router_controller_pods_recycled_total",
            "Pods evicted for being past their maximum lifetime.",
            registry=registry,
        )
        self.eviction_rejections = Counter(
            "drain_router_controller_eviction_rejections_total",
            "Evictions the API server refused, by why the pod is held (DisruptionBudget, Forbidden, "
            "EvictionFailed) or, for a pod gone or replaced, the Status reason.",
            ["reason"],
            registry=registry,
        )
        self.lifecycle_actions = Counter(
            "drain_router_controller_lifecycle_actions_total",
            "Lifecycle rules carried out, by policy.",
            ["policy"],
            registry=registry,
        )
        self.recycle_held_since = Gauge(
            "drain_router_controller_recycle_held_since_timestamp_seconds",
            "Unix time since which a ModelService's expired pod is held (its deadline); no series while none is.",
            ["namespace", "name"],
            registry=registry,
        )
        self.deletion_stage_since = Gauge(
            "drain_router_controller_deletion_stage_since_timestamp_seconds",
            "Unix time a deleting ModelService entered its current stage (its Deleting condition's "
            "lastTransitionTime); one series per ModelService being deleted, labelled with the stage.",
            ["namespace", "name", "stage"],
            registry=registry,
        )
        self._stages: dict[tuple[str, str], str] = {}
        self.wakes = Counter(
            "drain_router_controller_wakes_total",
            "Wakes of a scaled-to-zero ModelService (--activator-service), by outcome: awoken (a router "
            "answered ready, the route pointed back), failed (none within activationTimeoutSeconds).",
            ["outcome"],
            registry=registry,
        )
        # Both outcomes from the start: a first failed wake is then a rise from 0 that increase()
        # sees, not a series born at 1 that an alert on increase() misses.
        for outcome in ("awoken", "failed"):
            self.wakes.labels(outcome)
        self.phase_services = Gauge(
            "drain_router_controller_phase_services",
            "ModelServices per phase (Active, ScaledToZero, Waking), as the last lifecycle pass of each "
            "recorded it (--activator-service).",
            ["phase"],
            registry=registry,
        )
        self._phases: dict[tuple[str, str], str] = {}
        self.leader = Gauge(
            "drain_router_controller_leader",
            "1 while this replica holds the leader Lease and runs the operator; 0 on a standby.",
            registry=registry,
        )

    def set_recycle_held(self, namespace: str, name: str, since: float | None) -> None:
        """The hold of a ModelService's expired pod: since when (its deadline), or ``None`` for none."""
        self.recycle_held_pods.labels(namespace, name).set(0 if since is None else 1)
        if since is None:
            with contextlib.suppress(KeyError):
                self.recycle_held_since.remove(namespace, name)
        else:
            self.recycle_held_since.labels(namespace, name).set(since)

    def forget_recycling(self, namespace: str, name: str) -> None:
        """No series left behind for a ModelService that is gone."""
        for gauge in (self.recycle_held_pods, self.recycle_held_since):
            with contextlib.suppress(KeyError):
                gauge.remove(namespace, name)
        self.set_phase(namespace, name, None)

    def set_phase(self, namespace: str, name: str, phase: str | None) -> None:
        """A ModelService's phase (``None``: gone), counted in :attr:`phase_services`."""
        if phase is None:
            self._phases.pop((namespace, name), None)
        else:
            self._phases[(namespace, name)] = phase
        for value in ("Active", "ScaledToZero", "Waking"):
            self.phase_services.labels(value).set(sum(1 for p in self._phases.values() if p == value))

    def set_deletion_stage(self, namespace: str, name: str, stage: str | None, since: float | None) -> None:
        """The stage a deleting ModelService is in and since when; ``None`` (released, gone) removes it."""
        old = self._stages.pop((namespace, name), None)
        if old is not None and old != stage:
            with contextlib.suppress(KeyError):
                self.deletion_stage_since.remove(namespace, name, old)
        if stage is not None and since is not None:
            self._stages[(namespace, name)] = stage
            self.deletion_stage_since.labels(namespace, name, stage).set(since)
        elif old is not None and old == stage:
            with contextlib.suppress(KeyError):
                self.deletion_stage_since.remove(namespace, name, old)
