"""The WebSocket workloads of the bench, each round against the targets of :data:`targets.WS_TARGETS`:
an echo in a closed loop, and idle sessions held open (a fresh process per round). A target that does
not forward the upgrade gets a skipped cell."""

from __future__ import annotations

from bench import loadgen, targets
from bench.harness import Group, Harness, Workload, fresh_rss

WS = Group("ws", "WebSocket")


def _targets(bench: Harness) -> list[targets.Target]:
    return [t for t in bench.targets if t.name in targets.WS_TARGETS]


def ws_url(target: targets.Target) -> str:
    return target.url.replace("http://", "ws://", 1) + "/v1/realtime"


async def _skipped(bench: Harness, round_no: int, workload: str, target: targets.Target) -> bool:
    """Record a skipped cell (and say so) when ``target`` does not forward the WebSocket upgrade."""
    status = await loadgen.ws_handshake(ws_url(target))
    if status == 101:
        return False
    reason = f"answers the WebSocket upgrade with {status}" if status else "no answer to the WebSocket upgrade"
    bench.skip(round_no, workload, target, reason)
    return True


async def ws_echo(bench: Harness, name: str, round_no: int) -> None:
    for target in _targets(bench):
        await _echo(bench, name, target, round_no)


async def _echo(bench: Harness, name: str, target: targets.Target, round_no: int) -> None:
    if await _skipped(bench, round_no, name, target):
        return
    plan = bench.plan
    await bench.measure(
        round_no,
        name,
        target,
        "messages_total",
        lambda: loadgen.ws_echo(
            ws_url(target),
            plan.ws_sessions,
            plan.seconds,
            message_bytes=plan.ws_message_bytes,
            warmup=min(0.2, plan.seconds / 4),
        ),
    )


async def ws_idle_hold(bench: Harness, name: str, round_no: int) -> None:
    for target in _targets(bench):
        if target.name != "direct":
            await _hold(bench, name, target, round_no)


async def _hold(bench: Harness, name: str, target: targets.Target, round_no: int) -> None:
    """A fresh instance per round, as for held streams."""
    fresh = type(target)(target.name, target.label, drain_signal=target.drain_signal)
    fresh.start(bench.ctx, instance=f"-ws-hold-r{round_no}")
    try:
        if await _skipped(bench, round_no, name, fresh):
            return
        count = min(bench.plan.ws_hold_sessions, bench.max_held)
        await bench.measure(
            round_no,
            name,
            fresh,
            None,
            lambda: loadgen.ws_hold(ws_url(fresh), count, fresh_rss(fresh), settle=bench.plan.hold_settle_secs),
        )
    finally:
        fresh.stop()


WORKLOADS = (
    Workload("ws_echo", WS, ws_echo),
    Workload("ws_idle_hold", WS, ws_idle_hold),
)
