"""Every workload of the bench, in run order, from the modules that declare them: each module names
its workloads once, in its ``WORKLOADS`` (a :class:`~bench.harness.Workload` each: name, group, what
it does, what it needs). The ``--workloads`` names and groups, the runner's order and the report's
groups all come from this table; a new workload is one more entry in its module's ``WORKLOADS`` (and,
for a new module, one more line here)."""

from __future__ import annotations

from bench import (
    activator_cost,
    drain_workload,
    grpc_workloads,
    http_workloads,
    overload,
    tracing_overhead,
    ws_workloads,
)
from bench.harness import Group, Plan, Workload

#: Every workload, in run order: each round runs their cells in this order, and the steps before and
#: after the rounds go in this order too.
REGISTRY: tuple[Workload, ...] = (
    *http_workloads.WORKLOADS,
    *ws_workloads.WORKLOADS,
    *grpc_workloads.WORKLOADS,
    *drain_workload.WORKLOADS,
    *overload.WORKLOADS,
    *tracing_overhead.WORKLOADS,
    *activator_cost.WORKLOADS,
)
BY_NAME: dict[str, Workload] = {w.name: w for w in REGISTRY}
if len(BY_NAME) != len(REGISTRY):
    raise ValueError("two workloads of the bench have one name")
#: Every workload's name, in run order (``sse_paced`` is one record per concurrency of the plan).
WORKLOADS: tuple[str, ...] = tuple(BY_NAME)
#: The groups, in the order their first workload runs.
GROUPS: tuple[Group, ...] = tuple(dict.fromkeys(w.group for w in REGISTRY))
#: Names that select several workloads at once (``--workloads grpc``).
WORKLOAD_GROUPS: dict[str, tuple[str, ...]] = {
    group.name: tuple(w.name for w in REGISTRY if w.group == group) for group in GROUPS
}


def select_workloads(spec: str | None) -> tuple[str, ...]:
    """``--workloads``: comma-separated workloads or groups; every workload when empty. Raises
    ``ValueError`` naming an unknown one."""
    if not spec:
        return WORKLOADS
    wanted: set[str] = set()
    for name in (n.strip() for n in spec.split(",")):
        if not name:
            continue
        if name not in WORKLOADS and name not in WORKLOAD_GROUPS:
            raise ValueError(f"unknown workload {name!r}; choose from {', '.join((*WORKLOADS, *WORKLOAD_GROUPS))}")
        wanted.update(WORKLOAD_GROUPS.get(name, (name,)))
    return tuple(w for w in WORKLOADS if w in wanted)


def workload_names(plan: Plan, selected: tuple[str, ...] = WORKLOADS) -> list[str]:
    """The workload names of the records a run of ``selected`` makes."""
    return [name for workload in selected for name in BY_NAME[workload].record_names(plan)]


def group_of(record: str) -> Group:
    """The group of the workload that makes records named ``record`` (a results file's
    ``workload``); the first group for a name no workload makes (an older run's)."""
    return next((w.group for w in REGISTRY if w.makes(record)), GROUPS[0])
