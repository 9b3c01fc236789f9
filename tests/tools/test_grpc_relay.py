"""The demo balancer's gRPC side: calls relayed whole to backends in rotation, round robin, no
retries, a client's cancel passed on; against the fake model's gRPC endpoint in this loop."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from drain_router_dev import balancer, fake_model, grpc_load
from drain_router_dev.fake_model import testing
from drain_router_dev.process import free_port, wait_until

Start = Callable[..., Awaitable[tuple[balancer.Balancer, list[testing.FakeModel]]]]


@pytest.fixture
async def relayed() -> AsyncIterator[Start]:
    """``await relayed(models=2, dead=0)``: a balancer over ``models`` fake models with gRPC, plus
    ``dead`` backends in rotation (their probe answers) whose gRPC port nothing listens on."""
    async with contextlib.AsyncExitStack() as stack:

        async def start(models: int = 2, dead: int = 0, **settings: Any) -> tuple[balancer.Balancer, list[Any]]:
            settings = {"interval_ms": 5, **settings}
            running = [
                await stack.enter_async_context(testing.running(fake_model.Settings(**settings), grpc=True))
                for _ in range(models)
            ]
            backends = [
                balancer.Backend(f"m{i}", m.url, f"{m.url}/health", m.grpc_target) for i, m in enumerate(running)
            ]
            backends += [
                balancer.Backend(f"dead{i}", running[0].url, f"{running[0].url}/health", f"127.0.0.1:{free_port()}")
                for i in range(dead)
            ]
            lb = balancer.Balancer(backends, probe_interval=0.05, fall=1, rise=1)
            await lb.start()
            stack.push_async_callback(lb.stop)
            await wait_until(lambda: all(b.in_rotation for b in lb.backends), 5, "every backend in rotation")
            return lb, running

        yield start


async def _calls(lb: balancer.Balancer, n: int, **load: Any) -> list[grpc_load.Record]:
    calls = grpc_load.GrpcLoad(lb.grpc_target, clients=2, tokens=4, **load)
    await calls.start()
    try:
        await wait_until(lambda: len(calls.records), 10, f"{n} calls", until=lambda k: k >= n)
    finally:
        records = await calls.stop()
    return records


async def test_calls_arrive_whole_round_robin(relayed: Start) -> None:
    """Generate through the relay to two backends: every call whole; both backends served calls."""
    lb, models = await relayed()
    records = await _calls(lb, 10)
    assert {r.outcome for r in records} == {grpc_load.Outcome.OK}
    assert sum(m.grpc.completed for m in models) == len(records)
    assert all(m.grpc.completed for m in models)
    assert all(b.active == 0 for b in lb.backends)


async def test_a_refused_backend_fails_the_call_without_retry(relayed: Start) -> None:
    """A backend in rotation whose gRPC port refuses: its calls end UNAVAILABLE (counted in its
    errors), none is retried on the live one, which served exactly the calls that arrived whole."""
    lb, [model] = await relayed(models=1, dead=1)
    records = await _calls(lb, 10)
    failed = [r for r in records if r.outcome is grpc_load.Outcome.FAILED]
    assert failed and {r.code for r in failed} == {"UNAVAILABLE"}
    assert model.grpc.completed == sum(1 for r in records if r.outcome is grpc_load.Outcome.OK)
    assert lb.backends[1].errors["gRPC UNAVAILABLE"] == len(failed)


async def test_no_backend_in_rotation_is_unavailable(relayed: Start) -> None:
    lb, [model] = await relayed(models=1)
    model.healthy = False
    await wait_until(lambda: not lb.backends[0].in_rotation, 5, "the backend out of rotation")
    records = await _calls(lb, 2)
    assert {(r.outcome, r.code) for r in records} == {(grpc_load.Outcome.FAILED, "UNAVAILABLE")}
    assert model.grpc.started == 0


async def test_a_client_that_leaves_cancels_the_backends_call(relayed: Start) -> None:
    """Every call left after a token or so: the backend saw each one cancelled, none completed."""
    lb, [model] = await relayed(models=1, interval_ms=20)
    records = await _calls(lb, 4, leave_fraction=1.0, seed=3)
    assert {r.outcome for r in records} == {grpc_load.Outcome.LEFT}
    await wait_until(lambda: model.grpc.active == 0, 5, "the backend's calls to end")
    assert (model.grpc.cancelled, model.grpc.completed) == (len(records), 0)
