"""The gRPC workloads of the bench, each round against the targets of :data:`targets.GRPC_TARGETS`
that opened a gRPC port: streamed tokens, unary calls, and idle open calls held (a fresh process per
round). A target whose Echo call fails gets a skipped cell. They need the upstream's gRPC port."""

from __future__ import annotations

import asyncio
from typing import Any

from bench import grpcload, targets
from bench.harness import Group, Harness, Workload, fresh_rss

GRPC = Group("grpc", "gRPC")


def _targets(bench: Harness) -> list[targets.Target]:
    return [t for t in bench.targets if t.grpc_port and t.name in targets.GRPC_TARGETS]


async def _skipped(bench: Harness, round_no: int, workload: str, target: targets.Target) -> bool:
    """Record a skipped cell (and say so) when an Echo call through ``target``'s gRPC port fails."""
    reason = await grpcload.probe("127.0.0.1", target.grpc_port)
    if reason is None:
        return False
    bench.skip(round_no, workload, target, reason)
    return True


async def grpc_stream(bench: Harness, name: str, round_no: int) -> None:
    for target in _targets(bench):
        await _stream(bench, name, target, round_no)


async def _stream(bench: Harness, name: str, target: targets.Target, round_no: int) -> None:
    if await _skipped(bench, round_no, name, target):
        return
    plan = bench.plan
    await bench.measure(
        round_no,
        name,
        target,
        "messages_total",
        lambda: grpcload.stream(
            "127.0.0.1",
            target.grpc_port,
            plan.grpc_streams,
            plan.seconds,
            messages=plan.grpc_messages,
            warmup=min(0.3, plan.seconds / 4),
        ),
    )


async def grpc_unary(bench: Harness, name: str, round_no: int) -> None:
    for target in _targets(bench):
        await _unary(bench, name, target, round_no)


async def _unary(bench: Harness, name: str, target: targets.Target, round_no: int) -> None:
    if await _skipped(bench, round_no, name, target):
        return
    plan = bench.plan

    async def run() -> dict[str, Any]:
        if plan.use_wrk and grpcload.h2load_available():
            return await asyncio.to_thread(
                grpcload.h2load,
                f"http://127.0.0.1:{target.grpc_port}",
                plan.grpc_unary_connections,
                plan.grpc_unary_streams,
                plan.seconds,
                body_bytes=plan.grpc_body_bytes,
                cpus=bench.loadgen_cpus,
            )
        return await grpcload.unary(
            "127.0.0.1",
            target.grpc_port,
            plan.grpc_unary_connections,
            plan.grpc_unary_streams,
            plan.seconds,
            body_bytes=plan.grpc_body_bytes,
            warmup=min(0.2, plan.seconds / 4),
        )

    await bench.measure(round_no, name, target, "requests", run)


async def grpc_idle_hold(bench: Harness, name: str, round_no: int) -> None:
    for target in _targets(bench):
        if target.name != "direct":
            await _hold(bench, name, target, round_no)


async def _hold(bench: Harness, name: str, target: targets.Target, round_no: int) -> None:
    """A fresh instance per round, as for held streams."""
    fresh = type(target)(target.name, target.label, drain_signal=target.drain_signal)
    fresh.start(bench.ctx, instance=f"-grpc-hold-r{round_no}")
    try:
        if await _skipped(bench, round_no, name, fresh):
            return
        plan = bench.plan
        count = min(plan.grpc_hold_streams, bench.max_held)
        await bench.measure(
            round_no,
            name,
            fresh,
            None,
            lambda: grpcload.hold(
                "127.0.0.1",
                fresh.grpc_port,
                count,
                fresh_rss(fresh),
                per_connection=plan.grpc_hold_per_connection,
                interval_ms=plan.grpc_hold_interval_ms,
                settle=plan.hold_settle_secs,
            ),
        )
    finally:
        fresh.stop()


WORKLOADS = (
    Workload("grpc_stream", GRPC, grpc_stream, needs_grpc_upstream=True),
    Workload("grpc_unary", GRPC, grpc_unary, needs_grpc_upstream=True),
    Workload("grpc_idle_hold", GRPC, grpc_idle_hold, needs_grpc_upstream=True),
)
