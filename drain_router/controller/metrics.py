"""Every ``drain_router_controller_*`` metric, in one place. Takes a registry so tests use a fresh one."""

from __future__ import annotations

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
        self.leader = Gauge(
            "drain_router_controller_leader",
            "1 while this replica holds the leader Lease and runs the operator; 0 on a standby.",
            registry=registry,
        )
