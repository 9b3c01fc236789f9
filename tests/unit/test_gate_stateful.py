"""The admission gate (:class:`drain_router.proxy.capacity.Gate`) under generated schedules: random
arrivals, completions, clients leaving the queue, queue timeouts and a closing, on a fake clock.

Whatever the order: every request ends exactly once (served, refused, or left); at most N hold a
slot; the queue never exceeds Q and is served first in, first out; while anything waits every slot
is taken; and once everything has ended no slot is held and nothing waits.
"""

from __future__ import annotations

import heapq
import itertools

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from prometheus_client import CollectorRegistry

from drain_router.decisions.capacity import Reason
from drain_router.metrics import Metrics
from drain_router.proxy.capacity import Gate


class Timer:
    def __init__(self, when: float, seq: int, callback, args) -> None:
        self.when, self.seq, self.callback, self.args = when, seq, callback, args
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True

    def __lt__(self, other: Timer) -> bool:
        return (self.when, self.seq) < (other.when, other.seq)


class FakeLoop:
    """The gate's clock and timers, advanced by the test."""

    def __init__(self) -> None:
        self.now = 0.0
        self.timers: list[Timer] = []
        self.seq = itertools.count()

    def time(self) -> float:
        return self.now

    def call_later(self, delay: float, callback, *args) -> Timer:
        timer = Timer(self.now + delay, next(self.seq), callback, args)
        heapq.heappush(self.timers, timer)
        return timer

    def advance(self, seconds: float) -> None:
        until = self.now + seconds
        while self.timers and self.timers[0].when <= until:
            timer = heapq.heappop(self.timers)
            self.now = timer.when
            if not timer.cancelled:
                timer.callback(*timer.args)
        self.now = until


class Request:
    """A request as the gate's waiter: it records how it ended, and fails on a second ending."""

    def __init__(self, machine: GateMachine, number: int) -> None:
        self.machine, self.number = machine, number
        self.ended: str | None = None
        self.holding = False

    def granted(self) -> None:
        assert self.ended is None and not self.holding
        self.holding = True
        self.machine.waiting.remove(self)
        self.machine.granted_order.append(self.number)

    def refused(self, reason: Reason, retry_after: float) -> None:
        assert self.ended is None and not self.holding, "a request ended twice"
        assert retry_after >= 1
        self.ended = f"refused:{reason.value}"
        if self in self.machine.waiting:
            self.machine.waiting.remove(self)


class GateMachine(RuleBasedStateMachine):
    @initialize(limit=st.integers(1, 4), queue_size=st.integers(0, 5))
    def build(self, limit: int, queue_size: int) -> None:
        self.loop = FakeLoop()
        self.gate = Gate(limit, queue_size, 5.0, metrics=Metrics(CollectorRegistry()), loop=self.loop)
        self.limit, self.queue_size = limit, queue_size
        self.numbers = itertools.count()
        self.requests: list[Request] = []
        self.waiting: list[Request] = []
        """Those in the queue, in arrival order (the model's own FIFO)."""
        self.granted_order: list[int] = []

    def holders(self) -> list[Request]:
        return [r for r in self.requests if r.holding]

    @rule()
    def arrive(self) -> None:
        request = Request(self, next(self.numbers))
        self.requests.append(request)
        if self.gate.take():
            request.holding = True
            return
        self.waiting.append(request)
        if not self.gate.wait(request):
            assert request.ended is not None
            assert request.ended != "refused:queue_full" or len(self.waiting) == self.queue_size

    @precondition(lambda self: any(r.holding for r in self.requests))
    @rule(data=st.data())
    def complete(self, data) -> None:
        request = data.draw(st.sampled_from(self.holders()))
        expected_next = self.waiting[0] if self.waiting else None
        request.holding = False
        request.ended = "served"
        self.gate.release(1.0)
        if expected_next is not None:
            assert expected_next.holding, "the oldest waiter gets the slot"

    @precondition(lambda self: bool(self.waiting))
    @rule(data=st.data())
    def leave(self, data) -> None:
        request = data.draw(st.sampled_from(self.waiting))
        self.waiting.remove(request)
        request.ended = "left"
        self.gate.withdraw(request)

    @rule(seconds=st.floats(0.1, 6.0))
    def time_passes(self, seconds: float) -> None:
        self.loop.advance(seconds)

    @rule()
    def closing(self) -> None:
        self.gate.close()
        assert not self.waiting
        assert len(self.gate) == 0

    @invariant()
    def bounds(self) -> None:
        if not hasattr(self, "gate"):
            return
        holders = self.holders()
        assert self.gate.active == len(holders) <= self.limit
        assert len(self.gate) == len(self.waiting) <= self.queue_size
        assert [w.number for w in self.gate.waiters] == [w.number for w in self.waiting]  # FIFO
        if self.waiting:
            assert self.gate.active == self.limit
        assert self.granted_order == sorted(self.granted_order)  # granted in arrival order

    def teardown(self) -> None:
        if not hasattr(self, "gate"):
            return
        self.gate.close()
        for request in self.holders():
            request.holding = False
            request.ended = "served"
            self.gate.release(1.0)
        assert self.gate.active == 0
        assert len(self.gate) == 0
        assert all(r.ended is not None for r in self.requests), "every request ends"


GateMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
test_gate_under_generated_schedules = GateMachine.TestCase
