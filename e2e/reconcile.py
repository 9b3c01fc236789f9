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

Realtime (WebSocket) sessions run beside the streams, and a router counts each session as one
request too, so they are accounted for explicitly (:class:`SessionView`, from the realtime clients'
records by :func:`session_view`): a session that ended with the client's Close 1000 is one of the
routers' ``completed``, one that ended with the router's Close 1001 at its in-flight deadline one of
their ``deadline_aborted``, one a router SIGKILL cut one of ``killed_inflight``, one a model crash cut
one of ``upstream_error``; those shares are taken off the router view before the streams' balances.
A handshake that failed is a lost request like any other (a crashed model's router answers 502 and
counts ``upstream_error``; one sent to a SIGKILLed router is in its kill window; one forwarded to a
frozen model server is aborted at the deadline, ``deadline_aborted``). Every session that
did not end with 1000 or 1001 must fall in the window of a fault the run injected, on that fault's
pod: any other is ``unexplained``, and the run is not clean. The fake model's ``/stats`` keeps
sessions out of its stream counters (``started``/``finished``/``cancelled``/``active``), so the
model view needs no share taken off; its ``sessions`` (open now) must be 0 at the end.

gRPC calls (vLLM's ``Generate``) need no such share: the caller folds each into every view as a
request, since their outcomes mean what the streams' do (the clients' ``ok``, ``left`` and lost; the
routers' ``grpc_requests_total{outcome}``, which shares ``requests_total``'s outcome names, while
their in-flight count holds both; the model servers' gRPC ``completed`` and ``cancelled``).
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Iterable


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
    sessions_open: int = 0
    """Realtime sessions still open at the last read of the surviving model servers (0 once the
    session clients closed)."""


#: How a realtime client saw a session end, as :func:`session_view` takes it.
NORMAL = "1000"
"""A Close 1000: the client was done (it closes only when the run stops)."""
GOING_AWAY = "1001"
"""A Close 1001: in this harness only a router's, at its in-flight deadline."""
CUT = "cut"
"""Opened, then ended without a Close 1000 or 1001 (1006: a reset or a cut tunnel; another code;
events out of order)."""
FAILED = "failed"
"""The handshake failed: no answer, or a status other than 101."""
ROUTER_KILL = "router_kill"
MODEL_CRASH = "model_crash"
STALL = "stall_past_deadline"
"""A stalled model server: the sessions it held get the router's 1001 at the deadline (clean), but a
handshake the router forwarded to it never gets its 101 and is aborted at the deadline."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class SessionEnd:
    """One realtime session as its client saw it end."""

    end: str
    """:data:`NORMAL`, :data:`GOING_AWAY`, :data:`CUT` or :data:`FAILED`."""
    started: float
    """When the handshake was sent (the harness's monotonic clock, as the fault windows)."""
    finished: float
    server: int | None = None
    """Which model server held the session (its pid, from ``session.created``); None if it never opened."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class FaultWindow:
    """Where a fault can cut sessions: from the SIGKILL (or the SIGSTOP) to the balancer seeing the
    pod's router down (plus a little slack), on the pod whose model server is ``server``."""

    fault: str
    """:data:`ROUTER_KILL`, :data:`MODEL_CRASH` or :data:`STALL`."""
    start: float
    end: float
    server: int | None
    """The pid of the pod's model server (the crashed one, or the one behind the killed router)."""

    def explains(self, session: SessionEnd) -> bool:
        """A session the fault cut (it was held by this pod's model server, open at the kill; a
        stall cuts none), or a handshake that failed inside the window (sent to the dead router, to
        the router whose model server was gone, or to the one whose model server was frozen)."""
        if session.end == CUT and self.fault != STALL:
            return session.server == self.server and session.finished >= self.start and session.started <= self.end
        if session.end == FAILED:
            return session.finished >= self.start and session.started <= self.end
        return False


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class SessionView:
    """The realtime sessions that ended, by how, and which fault explains each unclean end."""

    normal: int = 0
    """Ended with Close 1000 (the clients' own, at the end of the run): routers' ``completed``."""
    going_away: int = 0
    """Ended with a router's Close 1001 at its deadline: routers' ``deadline_aborted``."""
    killed: int = 0
    """Opened sessions a router SIGKILL cut: in that router's ``killed_inflight``."""
    crashed: int = 0
    """Opened sessions a model crash cut: the router counted each ``upstream_error``."""
    failed_kill: int = 0
    """Handshakes that failed inside a router SIGKILL's window: lost requests after a kill."""
    failed_crash: int = 0
    """Handshakes that failed inside a model crash's window: lost requests (the router's 502)."""
    failed_stall: int = 0
    """Handshakes sent to a router whose model server was frozen: the deadline aborted them (lost
    requests, ``deadline_aborted``)."""
    unexplained: int = 0
    """Every other end that was not a Close 1000 or 1001: no fault of the run explains it."""

    @property
    def sessions(self) -> int:
        return self.normal + self.going_away + self.unclean

    @property
    def unclean(self) -> int:
        return self.killed + self.crashed + self.handshakes_failed + self.unexplained

    @property
    def handshakes_failed(self) -> int:
        """Handshakes that failed inside a fault's window: lost requests, as streams can be."""
        return self.failed_kill + self.failed_crash + self.failed_stall

    @property
    def explained(self) -> dict[str, int]:
        """Unclean ends by the fault that explains them (faults with none left out)."""
        by_fault = {
            ROUTER_KILL: self.killed + self.failed_kill,
            MODEL_CRASH: self.crashed + self.failed_crash,
            STALL: self.failed_stall,
        }
        return {k: v for k, v in by_fault.items() if v}


def session_view(ends: Iterable[SessionEnd], windows: Iterable[FaultWindow]) -> SessionView:
    """Count the sessions' ends; each unclean one is explained by the first fault window that
    explains it (:meth:`FaultWindow.explains`), else it is ``unexplained``. Purely computational."""
    windows = list(windows)
    counts: collections.Counter[str] = collections.Counter()
    for session in ends:
        if session.end in (NORMAL, GOING_AWAY):
            counts[session.end] += 1
            continue
        fault = next((w.fault for w in windows if w.explains(session)), None)
        if fault is None:
            counts["unexplained"] += 1
        elif session.end == CUT:
            counts["killed" if fault == ROUTER_KILL else "crashed"] += 1
        else:
            counts[{ROUTER_KILL: "failed_kill", MODEL_CRASH: "failed_crash", STALL: "failed_stall"}[fault]] += 1
    return SessionView(
        normal=counts[NORMAL],
        going_away=counts[GOING_AWAY],
        killed=counts["killed"],
        crashed=counts["crashed"],
        failed_kill=counts["failed_kill"],
        failed_crash=counts["failed_crash"],
        failed_stall=counts["failed_stall"],
        unexplained=counts["unexplained"],
    )


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Reconciliation:
    requests: int
    """Streams, and session handshakes that failed inside a fault's window (lost requests too)."""
    lost: int
    explained: dict[str, int]
    """Lost requests by the view that accounts for them."""
    unaccounted: int
    """Lost requests that no view accounts for."""
    mismatches: tuple[str, ...]
    """Balances between the views that do not hold, each a sentence with the numbers."""
    sessions: SessionView = SessionView()
    """The realtime sessions, and the faults that explain their unclean ends."""

    @property
    def clean(self) -> bool:
        return self.unaccounted == 0 and self.sessions.unexplained == 0 and not self.mismatches


def _sessions_share(sessions: SessionView, routers: RouterView, mismatches: list[str]) -> RouterView:
    """The router view without the sessions' share: what the streams (and failed handshakes) left."""
    share = {
        "completed": ("ended with the client's Close 1000", sessions.normal),
        "deadline_aborted": ("ended with the router's Close 1001 at its deadline", sessions.going_away),
        "killed_inflight": ("were cut by a router SIGKILL", sessions.killed),
        "upstream_error": ("were cut by a model crash", sessions.crashed),
    }
    left: dict[str, int] = {}
    for field, (how, n) in share.items():
        counted = getattr(routers, field)
        if n > counted:
            mismatches.append(f"clients saw {n} sessions that {how}, routers counted only {counted} {field}")
        left[field] = max(0, counted - n)
    return dataclasses.replace(routers, **left)


def reconcile(
    clients: ClientView, routers: RouterView, models: ModelView, sessions: SessionView | None = None
) -> Reconciliation:
    """Check the three views against each other. Purely computational, no side effects."""
    mismatches: list[str] = []
    if sessions is None:
        sessions = SessionView()
    # 0. Realtime sessions: their share of the routers' counts comes off first; a handshake that
    #    failed is a lost request (after a kill when it failed inside a router SIGKILL's window).
    routers = _sessions_share(sessions, routers, mismatches)
    handshakes_lost = sessions.handshakes_failed
    clients = dataclasses.replace(
        clients, lost=clients.lost + handshakes_lost, lost_after_kill=clients.lost_after_kill + sessions.failed_kill
    )
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
    #    was completed, or its client left at the very end, or the router aborted it at the deadline
    #    while its model server was frozen (a stall: resumed, the model server writes the stream's last
    #    chunks into the connection the router already closed, and counts it finished before the
    #    reset comes back); every cancellation has a router reason.
    if models.finished + slack < routers.completed:
        mismatches.append(f"routers completed {routers.completed} streams, models finished only {models.finished}")
    ended_elsewhere = routers.client_aborted + routers.deadline_aborted + routers.unresolved
    if models.finished > routers.completed + ended_elsewhere + slack:
        mismatches.append(
            f"models finished {models.finished} streams, routers completed {routers.completed} "
            f"(+{routers.client_aborted} client_aborted, +{routers.deadline_aborted} deadline_aborted, "
            f"+{routers.unresolved} unresolved, window {slack})"
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
    if models.sessions_open:
        mismatches.append(f"models still hold {models.sessions_open} realtime sessions after the clients closed")
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
        sessions=sessions,
    )
