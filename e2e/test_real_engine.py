"""A real engine in the proof: rolling restarts in front of llama.cpp's OpenAI-compatible server
(llama-cpp-python, SmolLM2-135M on the CPU) behind a real HAProxy, with the OpenAI SDK as the clients.

Each pod is a ``python -m llama_cpp.server`` engine and a ``drain-router serve`` in front of it,
ended the way the kubelet ends a pod with the chart's hooks: the router gets SIGTERM at t0 and, at
the same moment, the engine container's preStop hook (``GET /admin/drain-wait`` on the router's
admin port) starts; the engine gets its SIGTERM when the hook returns. Then both are started again
on the same ports. HAProxy checks every router's ``/readyz`` every 200 ms (one failure out, one
success in), pools its connections to them and never retries; the SDK clients do not retry either
(``max_retries=0``). Three arms, each with fresh pods: the drain on (``--shutdown-drain-secs 1``),
the drain off (``--shutdown-drain-secs 0``, everything else the same), and no router (HAProxy
straight to the engines, checking the engine's ``/docs``; the engine gets SIGTERM at t0).

Each stream is counted completed (a ``finish_reason`` and no exception), refused (no stream: a
connection error or a 5xx) or truncated (it started, then broke or ended without a ``finish_reason``).
The drain on must lose nothing; the drain off and no router must lose something, which proves the
clients can see a loss. And the router passes the engine's stream through unchanged: the same
greedy, seeded request straight to the engine and through a router gives the same bytes, but for
the completion's ``id`` and ``created``.

Run alone with ``pytest e2e/test_real_engine.py`` (or ``pytest -m engine``); needs ``make engine``
(skipped without it, failed with ``CI`` set).
"""

from __future__ import annotations

import asyncio
import collections
import re
import signal
import time
from pathlib import Path
from typing import Protocol

import aiohttp
import pytest

from drain_router_dev.process import Process, wait_until
from e2e import haproxy, probed, real_engine
from e2e.real_engine import Engine, Outcome, RouterPod

pytestmark = pytest.mark.engine

REPLICAS = 2
CYCLES = 2  # four restarts per arm
CLIENTS = 4  # two per engine: one generating, one waiting in the engine's queue
MAX_TOKENS = 48
# The clients send only as fast as two single-threaded engines complete streams (about two a
# second), so the balancer's probe is a Kubernetes readiness probe's shortest, not the 200 ms of the
# stand-in's e2e: every second, two failures out (PROBE_FALL). The drain outlasts that window.
PROBE_INTER_MS = 1000
PROBE_FALL = 2
DRAIN_SECS = 3
GRACE_SECS = 20
#: A clean end: the router exits 0; the engine (uvicorn) shuts down, then re-raises the SIGTERM.
CLEAN_EXIT = {"router": 0, "engine": -signal.SIGTERM}


class Pod(Protocol):
    name: str

    @property
    def server(self) -> probed.Server: ...

    @property
    def processes(self) -> list[Process]: ...

    async def start(self, session: aiohttp.ClientSession) -> None: ...

    async def terminate(self, session: aiohttp.ClientSession) -> list[tuple[str, int]]:
        """From the pod's deletion to its exit: each container's exit code, by kind (router, engine)."""
        ...


class EnginePod:
    """An engine alone, HAProxy checking its ``/docs``; SIGTERM at the pod's deletion."""

    def __init__(self, name: str, logs: Path) -> None:
        self.name = name
        self.engine = Engine(name, logs)

    @property
    def server(self) -> probed.Server:
        return probed.Server(self.name, self.engine.port)

    @property
    def processes(self) -> list[Process]:
        return [self.engine.process]

    async def start(self, session: aiohttp.ClientSession) -> None:
        await self.engine.start(session)

    async def terminate(self, session: aiohttp.ClientSession) -> list[tuple[str, int]]:
        self.engine.process.signal(signal.SIGTERM)
        return [("engine", await self.engine.process.wait_exit(timeout=20))]


def _kinds(records: list[real_engine.Record]) -> str:
    counts = collections.Counter(f"{r.outcome.value}: {r.detail[:80]}" for r in records)
    return "; ".join(f"{k} x{n}" for k, n in counts.most_common(4))


@pytest.mark.timeout(150)
@pytest.mark.parametrize("arm", ["drain-on", "drain-off", "no-router"])
async def test_rolling_restarts_of_a_real_engine(
    arm: str,
    engine_installed: None,
    haproxy_bin: str,
    processes: list[Process],
    session: aiohttp.ClientSession,
    logs: Path,
    tmp_path: Path,
    report: list[str],
) -> None:
    """1. two pods behind HAProxy, four SDK clients streaming chat completions through it 2. each
    pod in turn: terminate (router SIGTERM and the engine's preStop hold; without a router, engine
    SIGTERM), wait for every exit, start again, wait until HAProxy has it UP; two cycles.
    Result: drain on, every stream completed and every process ended cleanly; drain off and no
    router, some lost."""
    pods: list[Pod]
    if arm == "no-router":
        pods = [EnginePod(f"engine-{i}", logs) for i in range(REPLICAS)]
        check_path = real_engine.HEALTH_PATH
    else:
        drain = DRAIN_SECS if arm == "drain-on" else 0
        pods = [RouterPod(f"pod-{i}", logs, drain, GRACE_SECS) for i in range(REPLICAS)]
        check_path = probed.CHECK_PATH
    for pod in pods:
        processes.extend(pod.processes)
    await asyncio.gather(*(pod.start(session) for pod in pods))
    lb = haproxy.HAProxy(
        tmp_path / "haproxy", [p.server for p in pods], inter_ms=PROBE_INTER_MS, fall=PROBE_FALL, check_path=check_path
    )
    processes.append(lb.process)
    await lb.start()
    for pod in pods:
        await lb.wait_status(pod.name, "UP")

    load = real_engine.SdkLoad(lb.url, clients=CLIENTS, max_tokens=MAX_TOKENS)
    exit_codes: list[tuple[str, int]] = []

    def completed() -> int:
        return load.count(Outcome.COMPLETED)

    started = time.monotonic()
    await load.start()
    try:
        await wait_until(completed, 60, f"{CLIENTS} completed streams", until=lambda n: n >= CLIENTS)
        lost_before = [r for r in load.records if r.outcome is not Outcome.COMPLETED]
        assert not lost_before, f"lost before any restart: {_kinds(lost_before)}"
        for _cycle in range(CYCLES):
            for pod in pods:
                exit_codes += await pod.terminate(session)
                await pod.start(session)
                await lb.wait_status(pod.name, "UP", timeout=30)
        want = completed() + CLIENTS
        await wait_until(completed, 60, f"{want} completed streams", until=lambda n: n >= want)
    finally:
        records = await load.stop()
    elapsed = time.monotonic() - started

    counts = {o: sum(r.outcome is o for r in records) for o in Outcome}
    lost = [r for r in records if r.outcome is not Outcome.COMPLETED]
    durations = sorted(r.duration for r in records if r.outcome is Outcome.COMPLETED)
    report.append(
        f"{arm}: {counts[Outcome.COMPLETED]} completed, {counts[Outcome.REFUSED]} refused, "
        f"{counts[Outcome.TRUNCATED]} truncated of {len(records)} streams; {CYCLES * REPLICAS} restarts in "
        f"{elapsed:.0f} s; median stream {durations[len(durations) // 2]:.2f} s; exit codes "
        f"{sorted(collections.Counter(exit_codes).items())}" + (f" ({_kinds(lost)})" if lost else "")
    )
    if arm == "drain-on":
        assert not lost, f"{len(lost)} of {len(records)} lost with the drain on: {_kinds(lost)}"
        assert all(code == CLEAN_EXIT[kind] for kind, code in exit_codes), exit_codes
    else:
        assert lost, f"nothing lost in {len(records)} streams with {arm}: the clients cannot see a loss"


_VARIABLE = re.compile(rb'"(id|created)": ("[^"]*"|\d+)')


async def _raw_stream(session: aiohttp.ClientSession, url: str) -> tuple[int, str, bytes]:
    body = {**real_engine.request_body(MAX_TOKENS), "stream": True}
    async with session.post(f"{url}/v1/chat/completions", json=body) as resp:
        return resp.status, resp.headers.get("Content-Type", ""), await resp.read()


@pytest.mark.timeout(90)
async def test_router_passes_the_engines_stream_unchanged(
    engine_installed: None,
    processes: list[Process],
    session: aiohttp.ClientSession,
    logs: Path,
) -> None:
    """The same greedy, seeded streamed chat completion, straight to the engine and through a
    router: the same status, content type and SSE bytes, once each completion's ``id`` and
    ``created`` (a fresh uuid and the clock) are masked."""
    pod = RouterPod("pod", logs, DRAIN_SECS, GRACE_SECS)
    processes.extend(pod.processes)
    await pod.start(session)
    async with aiohttp.ClientSession() as clients:
        direct = await _raw_stream(clients, pod.engine.url)
        routed = await _raw_stream(clients, pod.router.url)
    assert direct[0] == routed[0] == 200, (direct[0], routed[0])
    assert direct[1] == routed[1] and direct[1].startswith("text/event-stream"), (direct[1], routed[1])
    assert b'"finish_reason": "length"' in direct[2] and direct[2].rstrip().endswith(b"data: [DONE]"), direct[2][-300:]
    chunks = direct[2].count(b"data: {")
    assert chunks > 1 and len(_VARIABLE.findall(direct[2])) == 2 * chunks, "the mask finds each chunk's id and created"
    assert _VARIABLE.sub(rb'"\1": "-"', direct[2]) == _VARIABLE.sub(rb'"\1": "-"', routed[2])


async def _first_chunk_then_sigterm(base_url: str, engine: Engine) -> real_engine.Record:
    """A long streamed chat completion through ``base_url`` with the OpenAI SDK: once its first
    chunk is in, the engine gets SIGTERM (a pod's deletion without the drain's preStop hold), and the
    stream is read on to its end, as an application would."""
    import openai

    t0 = time.monotonic()
    async with openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key="none", max_retries=0, timeout=30.0) as client:
        stream = await client.chat.completions.create(stream=True, **real_engine.request_body(LONG_TOKENS))
        finish: str | None = None
        try:
            async for chunk in stream:
                if engine.process.alive and chunk.choices and chunk.choices[0].delta.content:
                    engine.process.signal(signal.SIGTERM)
                if chunk.choices and chunk.choices[0].finish_reason:
                    finish = chunk.choices[0].finish_reason
        except openai.APIError as exc:
            return real_engine.Record(Outcome.TRUNCATED, time.monotonic() - t0, f"raised {type(exc).__name__}: {exc}")
    detail = "ended without finish_reason" if finish is None else finish
    return real_engine.Record(Outcome.TRUNCATED if finish is None else Outcome.COMPLETED, time.monotonic() - t0, detail)


LONG_TOKENS = 400
"""Far more than the engine writes before its SIGTERM lands: the stream is cut, never finished."""


@pytest.mark.timeout(120)
async def test_an_engine_stopped_mid_stream_makes_the_sdk_raise_through_the_router(
    engine_installed: None,
    processes: list[Process],
    session: aiohttp.ClientSession,
    logs: Path,
) -> None:
    """The engine gets SIGTERM mid-stream. Straight to the engine, the SDK returns a shorter answer
    and raises nothing (the engine ends the stream cleanly, without ``data: [DONE]`` or a
    ``finish_reason``). Through a router, the SDK raises the router's ``upstream_truncated`` error
    event, and the router counts the stream ``upstream_error`` and logs it truncated."""
    pod = RouterPod("pod", logs, DRAIN_SECS, GRACE_SECS)
    processes.extend(pod.processes)
    await pod.start(session)

    direct = await _first_chunk_then_sigterm(pod.engine.url, pod.engine)
    assert await pod.engine.process.wait_exit(timeout=20) == CLEAN_EXIT["engine"]
    assert direct.detail == "ended without finish_reason", direct

    await pod.engine.start(session)
    await wait_until(lambda: pod.router.readyz(session), 30, "the router ready again", until=lambda r: r[0] == 200)
    routed = await _first_chunk_then_sigterm(pod.router.url, pod.engine)
    assert "raised APIError" in routed.detail and "without its terminal event" in routed.detail, routed
    assert (await pod.router.metrics(session)).every_outcome.get("upstream_error") == 1
    seen: list[str] = []

    def truncated_logged() -> bool:
        seen.extend(line for line in pod.router.process.new_lines() if "proxy.stream_truncated" in line)
        return bool(seen)

    await wait_until(truncated_logged, 5, "the router's proxy.stream_truncated log line")
