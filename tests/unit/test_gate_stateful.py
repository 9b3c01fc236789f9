"""The admission gate (:class:`drain_router.admission.gate.Gate`) under generated schedules: random
arrivals, completions, clients leaving the queue, queue timeouts, resizes (0 slots: a held queue
that opens) and a closing, on a fake clock.

Whatever the order: every request ends exactly once (served, refused, or left); at most N hold a
slot (after a resize down, no more than held it then, until they finish); the queue never exceeds Q and is served first in, first out; while anything waits every slot
is taken; and once everything has ended no slot is held and nothing waits.
"""

from __future__ import annotations

import heapq
import itertools

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from prometheus_client import CollectorRegistry

from drain_router.admission.gate import Gate
from drain_router.decisions.capacity import Reason
from drain_router.metrics import Metrics


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
    @initialize(limit=st.integers(0, 4), queue_size=st.integers(0, 5))
    def build(self, limit: int, queue_size: int) -> None:
        self.loop = FakeLoop()
        self.gate = Gate(limit, queue_size, 5.0, metrics=Metrics(CollectorRegistry()), loop=self.loop)
        self.limit, self.queue_size = limit, queue_size
        self.ceiling = limit
        """The most that may hold a slot: the limit, or what held one at a resize down."""
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
        handed_on = self.gate.active <= self.limit  # above the limit only after a resize down
        expected_next = self.waiting[0] if self.waiting and handed_on else None
        request.holding = False
        request.ended = "served"
        self.gate.release(1.0)
        if expected_next is not None:
            assert expected_next.holding, "the oldest waiter gets the slot"
        elif self.waiting:
            assert not any(r.holding for r in self.waiting), "a slot above the limit is not handed on"

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

    @rule(limit=st.integers(0, 4))
    def resize(self, limit: int) -> None:
        oldest = self.waiting[: max(0, limit - len(self.holders()))]
        self.gate.resize(limit)
        assert all(r.holding for r in oldest), "the new slots go to the oldest waiters"
        self.limit = limit
        self.ceiling = max(limit, len(self.holders()))

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
        assert self.gate.active == len(holders) <= self.ceiling
        self.ceiling = max(self.limit, len(holders))
        assert len(self.gate) == len(self.waiting) <= self.queue_size
        assert [w.number for w in self.gate.waiters] == [w.number for w in self.waiting]  # FIFO
        if self.waiting:
            assert self.gate.active >= self.limit
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


class Held:
    """A waiter that records when it was granted or refused."""

    def __init__(self, log: list[str], name: str) -> None:
        self.log, self.name = log, name

    def granted(self) -> None:
        self.log.append(f"granted:{self.name}")

    def refused(self, reason: Reason, retry_after: float) -> None:
        self.log.append(f"refused:{self.name}:{reason.value}")


def test_a_gate_of_no_slots_holds_until_it_opens_then_grants_in_arrival_order() -> None:
    loop, log = FakeLoop(), []
    gate = Gate(0, 3, 5.0, metrics=Metrics(CollectorRegistry()), loop=loop)
    held = [Held(log, str(i)) for i in range(4)]
    assert not gate.take()
    assert [gate.wait(h) for h in held] == [True, True, True, False]
    assert log == ["refused:3:queue_full"]
    gate.resize(2)
    assert log[1:] == ["granted:0", "granted:1"] and gate.active == 2 and len(gate) == 1
    gate.release(1.0)
    assert log[3:] == ["granted:2"] and gate.active == 2


def test_a_gate_resized_down_hands_no_slot_on_above_its_limit() -> None:
    loop, log = FakeLoop(), []
    gate = Gate(2, 3, 5.0, metrics=Metrics(CollectorRegistry()), loop=loop)
    assert gate.take() and gate.take()
    waiting = Held(log, "w")
    assert gate.wait(waiting)
    gate.resize(1)
    gate.release(1.0)  # 2 held, limit 1: this slot is not handed on
    assert log == [] and gate.active == 1 and len(gate) == 1
    gate.release(1.0)  # at the limit again: the oldest waiter gets it
    assert log == ["granted:w"] and gate.active == 1
    loop.advance(10.0)
    assert log == ["granted:w"]  # its timer was cancelled


class Timed(Held):
    def refused(self, reason: Reason, retry_after: float) -> None:
        self.log.append(f"refused:{self.name}:{reason.value}:{retry_after:g}")


def test_a_fixed_retry_after_answers_every_refusal_but_when_leaving() -> None:
    """The activator's held queue: a wake takes about the last cold start, whatever the queue."""
    loop, log = FakeLoop(), []
    gate = Gate(0, 1, 5.0, metrics=Metrics(CollectorRegistry()), loop=loop)
    assert gate.retry_after is None
    gate.retry_after = 42.0
    assert gate.wait(Timed(log, "a")) and not gate.wait(Timed(log, "b"))
    loop.advance(6.0)
    assert log == ["refused:b:queue_full:42", "refused:a:queue_timeout:42"]
    assert gate.wait(Timed(log, "c"))
    gate.close()  # leaving: the retry goes to another replica at once
    assert log[2:] == ["refused:c:closing:1"]


def test_taken_waiters_leave_unanswered_oldest_first() -> None:
    loop, log = FakeLoop(), []
    gate = Gate(0, 3, 5.0, metrics=Metrics(CollectorRegistry()), loop=loop)
    held = [Held(log, str(i)) for i in range(3)]
    assert all(gate.wait(h) for h in held)
    assert gate.take_waiters() == held and len(gate) == 0
    loop.advance(10.0)
    assert log == []  # their timers were cancelled
