"""The gRPC load: its classification by table, and its clients against the fake model's gRPC endpoint
in this loop."""

from __future__ import annotations

import itertools

import pytest

from drain_router_dev import fake_model, grpc_load
from drain_router_dev.fake_model import testing
from drain_router_dev.grpc_load import CallResult, Outcome
from drain_router_dev.process import free_port, wait_until

WHOLE = (0, 1, 2)


@pytest.mark.parametrize(
    ("result", "outcome"),
    [
        (CallResult(code="OK", expected=3, tokens=WHOLE, complete=WHOLE, finish_reason="length"), Outcome.OK),
        (CallResult(code="UNAVAILABLE", expected=3), Outcome.FAILED),
        (CallResult(code="UNAVAILABLE", expected=3, tokens=(0,)), Outcome.CUT),
        (CallResult(code="DEADLINE_EXCEEDED", expected=3, tokens=WHOLE), Outcome.CUT),
        (CallResult(code="OK", expected=3, tokens=(0, 2), complete=WHOLE, finish_reason="length"), Outcome.INCOMPLETE),
        (
            CallResult(code="OK", expected=3, tokens=(0, 0, 1), complete=WHOLE, finish_reason="length"),
            Outcome.INCOMPLETE,
        ),
        (CallResult(code="OK", expected=3, tokens=WHOLE), Outcome.INCOMPLETE),
        (CallResult(code="OK", expected=3, tokens=WHOLE, complete=WHOLE, finish_reason="abort"), Outcome.INCOMPLETE),
        (CallResult(code="OK", expected=3, tokens=WHOLE, complete=(0, 1), finish_reason="length"), Outcome.INCOMPLETE),
        (CallResult(code="CANCELLED", expected=3, tokens=(0,), left=True), Outcome.LEFT),
    ],
    ids=[
        "whole",
        "failed-before-any-token",
        "cut-after-a-token",
        "cut-at-the-deadline",
        "missing-token",
        "repeated-token",
        "no-complete",
        "finished-by-abort",
        "complete-disagrees",
        "left",
    ],
)
def test_classify(result: CallResult, outcome: Outcome) -> None:
    assert grpc_load.classify(result) is outcome
    assert outcome.lost is (outcome not in (Outcome.OK, Outcome.LEFT))


async def test_clients_complete_calls_back_to_back() -> None:
    """1. three clients call Generate (4 tokens) over one channel 2. wait for nine calls. Result:
    every call whole, each a distinct request id, the model counted each as completed."""
    async with testing.running(fake_model.Settings(interval_ms=5), grpc=True) as model:
        calls = grpc_load.GrpcLoad(model.grpc_target, clients=3, tokens=4)
        await calls.start()
        try:
            await wait_until(lambda: len(calls.records), 10, "nine calls", until=lambda n: n >= 9)
        finally:
            records = await calls.stop()
        assert calls.lost == []
        assert {r.tokens_seen for r in records} == {4}
        assert len({r.request_id for r in records}) == len(records)
        assert model.grpc.completed == len(records)


async def test_staggered_clients_arrive_spread_over_one_call() -> None:
    """1. four clients staggered over 0.2 s call Generate (5 tokens, 50 ms apart) 2. wait for eight
    calls. Result: their first calls started about 50 ms apart (0.2 s / 4), not all at once; none lost."""
    async with testing.running(fake_model.Settings(interval_ms=50), grpc=True) as model:
        calls = grpc_load.GrpcLoad(model.grpc_target, clients=4, tokens=5, stagger_secs=0.2)
        await calls.start()
        try:
            await wait_until(lambda: len(calls.records), 10, "eight calls", until=lambda n: n >= 8)
        finally:
            records = await calls.stop()
    firsts = sorted(r.started for r in records)[:4]
    gaps = [b - a for a, b in itertools.pairwise(firsts)]
    assert all(0.03 < gap < 0.15 for gap in gaps), gaps
    assert not calls.lost


async def test_a_client_that_leaves_cancels_its_call() -> None:
    """With every call left after a few tokens: each is ``left`` (not lost) and the model server
    saw each cancelled, never completed."""
    async with testing.running(fake_model.Settings(interval_ms=20), grpc=True) as model:
        calls = grpc_load.GrpcLoad(model.grpc_target, clients=2, tokens=20, leave_fraction=1.0, seed=1)
        await calls.start()
        try:
            await wait_until(lambda: len(calls.records), 10, "four calls", until=lambda n: n >= 4)
        finally:
            records = await calls.stop()
        assert {r.outcome for r in records} == {Outcome.LEFT}
        await wait_until(lambda: model.grpc.active == 0, 5, "the cancelled calls to end")
        assert (model.grpc.cancelled, model.grpc.completed) == (len(records), 0)


async def test_no_server_is_a_failed_call_not_an_exception() -> None:
    """A target nothing listens on: each call FAILED with UNAVAILABLE, recorded, the loop goes on."""
    calls = grpc_load.GrpcLoad(f"127.0.0.1:{free_port()}", clients=1, tokens=3)
    await calls.start()
    try:
        await wait_until(lambda: len(calls.records), 10, "two calls", until=lambda n: n >= 2)
    finally:
        records = await calls.stop()
    assert {(r.outcome, r.code) for r in records} == {(Outcome.FAILED, "UNAVAILABLE")}
