"""Three views of the same requests, reconciled: purely computational, no I/O.

A fault scenario ends with three independent accounts of what happened to every request:

- the **clients**: each stream arrived whole (``ok``), was left on purpose by its client (``left``,
  the client-abort fault), or was lost (anything else: an error status, a cut stream, no answer);
- the **routers**: ``drain_router_requests_total{outcome}``, each router lifetime's last ``/metrics``
  scrape before it exited, summed; for a router that was SIGKILLed, its last scrape plus what its
  ``/admin/inflight`` said just before the kill (those streams die with it);
- the **model servers**: the fake model's ``/stats`` counters (started, finished, cancelled, active),
  each lifetime's last read, summed; for a model that was SIGKILLed, its last read's ``active``
  streams died with it.

:func:`reconcile` checks that the views agree and that every lost request is accounted for by a view:
a router counted it as ``upstream_error`` or ``deadline_aborted`` (a fault the scenario injected), or
it was in flight in a router that was SIGKILLed, or it was sent to that dead router before the
balancer's probe took it out. A lost request that no view accounts for is ``unaccounted``: that is
what the drain exists to prevent, and what the drain-off control must show.

Where a process is killed, the scrape before the kill and the kill itself cannot be one instant: the
harness measures, with the surviving view, how many requests started or finished in between (the
``*_window`` fields), and the balances between views allow exactly that much difference, no more.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ClientView:
    ok: int
    """Streams that arrived whole (200, every chunk in order, ``[DONE]``)."""
    left: int = 0
    """Streams the client abandoned on purpose (not losses)."""
    lost: int = 0
    """Every other request: error status, cut stream, no answer."""
    lost_after_kill: int = 0
    """Of ``lost``: those that ended after a router's SIGKILL and were sent before the balancer
    saw that router down."""

    @property
    def requests(self) -> int:
        return self.ok + self.left + self.lost


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class RouterView:
    completed: int = 0
    client_aborted: int = 0
    upstream_error: int = 0
    deadline_aborted: int = 0
    rejected: int = 0
    killed_inflight: int = 0
    """``/admin/inflight`` just before each SIGKILL, summed: streams that died with their router."""
    unresolved: int = 0
    """In flight at a router's last scrape before a clean exit, whose outcome no scrape saw (only
    when the router exited between scrapes; a drained router is scraped idle)."""
    kill_window: int = 0
    """Requests the killed routers' model servers saw start or finish between the routers' last
    scrape and the SIGKILL: what the router view may have missed."""

    @property
    def counted(self) -> int:
        return self.completed + self.client_aborted + self.upstream_error + self.deadline_aborted + self.rejected


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ModelView:
    started: int = 0
    finished: int = 0
    cancelled: int = 0
    active: int = 0
    """Still streaming at the last read of the surviving model servers (0 once traffic stopped)."""
    crashed_active: int = 0
    """``active`` at the last read before each model server SIGKILL: streams cut by the crash."""
    crash_window: int = 0
    """Requests the crashed models' routers saw start or finish between the model's last read and the
    SIGKILL: what the model view may have missed."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Reconciliation:
    requests: int
    lost: int
    explained: dict[str, int]
    """Lost requests by the view that accounts for them."""
    unaccounted: int
    """Lost requests that no view accounts for."""
    mismatches: tuple[str, ...]
    """Balances between the views that do not hold, each a sentence with the numbers."""

    @property
    def clean(self) -> bool:
        return self.unaccounted == 0 and not self.mismatches


def reconcile(clients: ClientView, routers: RouterView, models: ModelView) -> Reconciliation:
    """Check the three views against each other. Purely computational, no side effects."""
    mismatches: list[str] = []
    slack = routers.kill_window + models.crash_window

    # 1. Lost requests outside a SIGKILL's window: the routers must have counted each as a failure.
    router_failures = routers.upstream_error + routers.deadline_aborted
    lost_elsewhere = clients.lost - clients.lost_after_kill
    unaccounted = max(0, lost_elsewhere - router_failures)
    if router_failures > lost_elsewhere + slack:
        mismatches.append(
            f"routers counted {router_failures} failed requests (upstream_error + deadline_aborted) "
            f"but clients lost only {lost_elsewhere} outside SIGKILL windows"
        )

    # 2. Lost after a SIGKILL: the killed router's in-flight streams, then what the balancer sent to
    #    the dead address before its probe took it out.
    killed_lost = min(clients.lost_after_kill, routers.killed_inflight + routers.kill_window)
    probe_window = clients.lost_after_kill - killed_lost
    if clients.lost_after_kill + routers.kill_window < routers.killed_inflight:
        mismatches.append(
            f"killed routers had {routers.killed_inflight} requests in flight but clients lost "
            f"only {clients.lost_after_kill} after the kills"
        )

    # 3. Whole streams, and streams the clients left. A client that leaves is seen leaving by the
    #    router (client_aborted), unless the rest of the stream was already on its way (the balancer
    #    passes the close on only at its next write): then the router completed it.
    left_completed = clients.left - routers.client_aborted
    if routers.client_aborted > clients.left + routers.unresolved + slack:
        mismatches.append(
            f"routers counted {routers.client_aborted} client_aborted, but clients left only {clients.left} streams"
        )
    delivered = clients.ok + max(0, left_completed)
    if not routers.completed - slack <= delivered <= routers.completed + routers.unresolved + slack:
        mismatches.append(
            f"clients got {clients.ok} streams whole (+{max(0, left_completed)} left after the "
            f"router had sent everything), routers completed {routers.completed} "
            f"(+{routers.unresolved} unresolved, window {slack})"
        )

    # 4. The model servers: every stream a router completed, a model finished; one a model finished
    #    was completed, or its client left at the very end; every cancellation has a router reason.
    if models.finished + slack < routers.completed:
        mismatches.append(f"routers completed {routers.completed} streams, models finished only {models.finished}")
    if models.finished > routers.completed + routers.client_aborted + routers.unresolved + slack:
        mismatches.append(
            f"models finished {models.finished} streams, routers completed {routers.completed} "
            f"(+{routers.client_aborted} client_aborted, +{routers.unresolved} unresolved, "
            f"window {slack})"
        )
    reasons = routers.client_aborted + routers.deadline_aborted + routers.killed_inflight
    if models.cancelled > reasons + routers.unresolved + slack:
        mismatches.append(
            f"models cancelled {models.cancelled} streams; routers account for {reasons} "
            f"(client_aborted {routers.client_aborted} + deadline_aborted {routers.deadline_aborted} "
            f"+ killed in flight {routers.killed_inflight})"
        )
    if routers.client_aborted > models.cancelled + (models.finished - routers.completed) + slack:
        mismatches.append(
            f"routers counted {routers.client_aborted} client_aborted, models cancelled only "
            f"{models.cancelled} (and finished {models.finished - routers.completed} more than completed)"
        )

    # 5. A model crash cuts its streams: the router counts each as upstream_error.
    if routers.upstream_error + slack < models.crashed_active:
        mismatches.append(
            f"crashed models had {models.crashed_active} streams open, routers counted only "
            f"{routers.upstream_error} upstream_error"
        )

    # 6. Each model's own books balance, and nothing is still streaming.
    if models.started != models.finished + models.cancelled + models.active + models.crashed_active:
        mismatches.append(
            f"model counters do not add up: started {models.started} != finished {models.finished} "
            f"+ cancelled {models.cancelled} + active {models.active} + crashed {models.crashed_active}"
        )
    if models.active:
        mismatches.append(f"models still stream {models.active} requests after the load stopped")
    if routers.rejected:
        mismatches.append(f"routers rejected {routers.rejected} requests (malformed): the clients send none")

    explained = {
        "upstream_error": min(routers.upstream_error, lost_elsewhere),
        "deadline_aborted": min(routers.deadline_aborted, max(0, lost_elsewhere - routers.upstream_error)),
        "killed_inflight": killed_lost,
        "balancer_probe_window": probe_window,
    }
    return Reconciliation(
        requests=clients.requests,
        lost=clients.lost,
        unaccounted=unaccounted,
        explained={k: v for k, v in explained.items() if v},
        mismatches=tuple(mismatches),
    )
