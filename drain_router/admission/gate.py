"""The admission gate (``--max-concurrent-requests``): N slots, and a bounded first-in first-out
queue of what waits for one. What a request gets is decided in :mod:`drain_router.decisions.capacity`;
this is the I/O around it: the slots, the waiters and their timers, the metrics.

A request that finds a free slot takes it (:meth:`Gate.take`: a comparison and an increment) and
gives it back when it ends (:meth:`Gate.release`), exactly when it leaves the in-flight count. One
past N waits (:meth:`Gate.wait`) with a timer of ``--queue-timeout-secs``: a released slot goes
straight to the oldest waiter (never back to the pool of free slots while one waits, so a newcomer
cannot overtake it), which enters the in-flight count at once and is forwarded in the next turn of
the loop (:meth:`Waiter.granted`). A waiter whose client leaves is withdrawn at once
(:meth:`Gate.withdraw`); at closing every waiter is refused (:meth:`Gate.close`). Each refusal is
counted and handed to the waiter with the ``Retry-After`` estimate (:meth:`Waiter.refused`).

The queue is a dict (insertion-ordered: the oldest first; removal of any waiter in O(1)), never
longer than ``--queue-size``; each entry holds the waiter's timer and when it started to wait.
The number of slots can change (:meth:`Gate.resize`): raised, the oldest waiters take the new
slots in arrival order; lowered, slots held above it are not handed on. A gate of 0 slots holds
every request until it opens: the activator's held queue of one sleeping ModelService.
Invariant: while anything waits, every slot is taken.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

from drain_router.decisions import capacity
from drain_router.decisions.capacity import Answer, Reason, Verdict

_REASON = {Verdict.QUEUE_FULL: Reason.QUEUE_FULL, Verdict.CLOSING: Reason.CLOSING}


class Waiter(Protocol):
    """A request waiting for a slot, as the gate acts on it."""

    def granted(self) -> None:
        """It holds a slot now (it left the queue): enter the in-flight count, forward soon."""

    def refused(self, reason: Reason, retry_after: float) -> None:
        """It never gets a slot (it left the queue, or never joined): answer it, ``retry_after``
        seconds estimated."""

    def answer(self, answer: Answer) -> bool:
        """The caller's own answer while it waits (:meth:`Gate.take_waiters`, the activator's):
        True when it took it and left."""


class GateMetrics(Protocol):
    """What a gate counts: the router's :class:`~drain_router.metrics.Metrics`, or a held queue's own
    (the activator keeps one gate per ModelService, each with its own series)."""

    @property
    def queue_depth(self) -> Any: ...
    @property
    def queue_wait(self) -> Any: ...
    @property
    def admission_rejections(self) -> Any: ...


class Gate:
    __slots__ = (
        "active",
        "closing",
        "hold",
        "leaving",
        "limit",
        "loop",
        "metrics",
        "queue_size",
        "retry_after",
        "timeout",
        "waiters",
    )

    def __init__(
        self,
        limit: int,
        queue_size: int,
        timeout: float,
        *,
        metrics: GateMetrics,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        self.loop = loop
        """The loop of the timers and the clock (None: the running one, looked up when needed)."""
        self.limit = limit
        self.queue_size = queue_size
        self.timeout = timeout
        self.metrics = metrics
        self.active = 0
        """Slots taken (by requests in flight, and by waiters granted one)."""
        self.waiters: dict[Waiter, tuple[asyncio.TimerHandle, float]] = {}
        """The queue, oldest first: each waiter's timeout and the loop time it started waiting."""
        self.hold: float | None = None
        """The mean time a slot is held, over recent releases (None: none yet)."""
        self.closing = False
        """Closing: nothing waits any more."""
        self.leaving = False
        """Draining or later: a refusal's retry goes to another replica."""
        self.retry_after: float | None = None
        """When set, every refusal's ``Retry-After`` (seconds) instead of the estimate from the queue
        and the completion rate (the activator's held queue: a wake takes as long as the last cold
        start, whatever the queue)."""
        metrics.queue_depth.set_function(self.waiters.__len__)

    def _loop(self) -> asyncio.AbstractEventLoop:
        return self.loop or asyncio.get_running_loop()

    def __len__(self) -> int:
        return len(self.waiters)

    def __bool__(self) -> bool:
        raise NotImplementedError("use len(gate) for the queue, gate.active for the slots")

    # -- the hot path ----------------------------------------------------------------------------

    def take(self) -> bool:
        """A slot now, if one is free (then nothing waits: the invariant)."""
        if self.active < self.limit:
            self.active += 1
            return True
        return False

    def release(self, held: float) -> None:
        """A slot held ``held`` seconds is given back: to the oldest waiter, if one waits."""
        self.hold = capacity.mean_hold(self.hold, held)
        waiters = self.waiters
        if not waiters or self.active > self.limit:  # (above it only after a resize down)
            self.active -= 1
            return
        self._grant_oldest(waiters)

    def resize(self, limit: int) -> None:
        """The number of slots becomes ``limit``. Raised, the oldest waiters get the new slots at
        once, in arrival order (a held queue opening: 0 while its service sleeps, then its size);
        lowered, slots held above it are not handed on when they come back."""
        self.limit = limit
        waiters = self.waiters
        while waiters and self.active < limit:
            self.active += 1
            self._grant_oldest(waiters)

    def _grant_oldest(self, waiters: dict[Waiter, tuple[asyncio.TimerHandle, float]]) -> None:
        """The oldest waiter leaves the queue with a slot already counted in ``active``."""
        waiter = next(iter(waiters))
        timer, since = waiters.pop(waiter)
        timer.cancel()
        self.metrics.queue_wait.observe(self._loop().time() - since)
        waiter.granted()

    # -- waiting -----------------------------------------------------------------------------------

    def wait(self, waiter: Waiter) -> bool:
        """No slot was free: ``waiter`` joins the queue (True), or is refused at once (False)."""
        verdict = capacity.arrival(len(self.waiters), self.queue_size, closing=self.closing)
        if verdict is not Verdict.WAIT:
            self._refuse(waiter, _REASON[verdict])
            return False
        loop = self._loop()
        self.waiters[waiter] = (loop.call_later(self.timeout, self._timed_out, waiter), loop.time())
        return True

    def withdraw(self, waiter: Waiter) -> None:
        """``waiter``'s client left while it waited: its place is freed at once."""
        entry = self.waiters.pop(waiter, None)
        if entry is not None:
            entry[0].cancel()
            self.metrics.queue_wait.observe(self._loop().time() - entry[1])

    def close(self) -> None:
        """Closing: every waiter is refused now (the model server never saw them), and so is every
        request that finds no slot from now on."""
        self.closing = self.leaving = True
        while self.waiters:
            waiter = next(iter(self.waiters))
            self.withdraw(waiter)
            self._refuse(waiter, Reason.CLOSING)

    def _timed_out(self, waiter: Waiter) -> None:
        if waiter in self.waiters:
            self.withdraw(waiter)
            self._refuse(waiter, Reason.QUEUE_TIMEOUT)

    def _refuse(self, waiter: Waiter, reason: Reason) -> None:
        self.metrics.admission_rejections.labels(reason.value).inc()
        retry = self.retry_after
        if retry is None or self.leaving:  # (leaving: the retry goes to another replica, at once)
            retry = capacity.retry_after(len(self.waiters), self.limit, self.hold, leaving=self.leaving)
        waiter.refused(reason, retry)

    def take_waiters(self) -> list[Waiter]:
        """Every waiter leaves the queue unanswered, oldest first: the caller answers them (the
        activator's 404 for a service that does not exist)."""
        waiters = list(self.waiters)
        for waiter in waiters:
            self.withdraw(waiter)
        return waiters
