"""The ``activator`` workload of the bench: what ``drain-router activator`` costs per relayed and per
held request, against the router.

The Kubernetes API is the package's stand-in (:mod:`drain_router_dev.fake_kube`, served in the
bench's process, on the load generator's core); the "model pod" is the bench upstream itself, which
answers ``GET /readyz`` 200 on its own port: the activator probes it there and forwards to it
(``spec.router.port`` and ``adminPort`` both the upstream's port, pod IP 127.0.0.1). The activator
and the routers run as shipped (default poll interval, log level), pinned to the servers' cores.

Compared, CPU from the bench's own per-process meter (the whole process tree):

- ``activator_small_get``, **per relayed request**: the small GET workload (same connections and
  window as ``small_get``, on the port the stand-in's port map assigns the service) through an
  activator whose service is awake (it forwards to the upstream: held queue open, a pool to the pod) against a plain
  ``drain-router serve`` in front of the same upstream, one after the other in each round. Both
  processes live for the whole run. ``target_cpu_us_per_unit``: CPU per request.
- ``activator_held``, **per held request**: a fresh process per round and arm, ``activator_held``
  (the plan's) small GETs opened on their own connections and held: by an activator for a service
  asleep (no pod listed: nothing ready, never forwarded), against a router with
  ``--max-concurrent-requests 1 --queue-size N`` whose one slot is taken by a stream the upstream
  holds open (``/v1/completions?hold=1``), so each GET waits in its admission queue. Until the
  process's own gauge (``activator_held_requests``, ``queue_depth``) says N: the CPU per held request
  (accepting, parsing, queueing them; the activator's polls of the API in that window included) and,
  after a settle, the RSS growth per held request. Then the release: the pod listed (the activator
  forwards them all at its next poll) or the slot's stream closed (the router admits them one at a
  time): the CPU per released request until every answer is read (``released`` counts the 200s).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from dataclasses import dataclass
from typing import Any

import aiohttp

from bench import procstat, targets, tracing_overhead
from bench.harness import Group, Harness, Session, Workload
from drain_router_dev import fake_kube

NS = "bench"
AWAKE, ASLEEP = "awake", "asleep"
#: How long a step (every request held, every answer read) may take before the cell is failed.
STEP_TIMEOUT_SECS = 60.0
#: Connections opened at once while filling the queue.
PARALLEL_CONNECTS = 200


@dataclass
class ActivatorTarget(targets.Router):
    """``drain-router activator`` pointed at a stand-in API (``kube``), its traffic port (the
    target's ``port``) assigned in the stand-in's port map to ``service``; ready when its ``/readyz``
    answers 200 and that port accepts connections (it opens it at its first read of the map)."""

    kube: fake_kube.FakeKube | None = None
    service: str = AWAKE

    def command(self, ctx: targets.Context) -> list[str]:
        assert self.kube is not None
        self.kube.ports = {str(self.port): f"{NS}/{self.service}/http"}  # (the port is picked by start())
        return [
            *self.launcher(),
            "activator",
            "--host",
            "127.0.0.1",
            "--admin-host",
            "127.0.0.1",
            "--admin-port",
            str(self.admin_port),
            "--kube-api",
            self.kube.url,
            "--ports-configmap",
            fake_kube.PORTS_CONFIGMAP,
            *self.extra_args,
        ]

    def speaks_grpc(self) -> bool:
        return False

    def wait_ready(self) -> None:
        assert self.process is not None
        targets.wait_ready(self.process, self.readiness_url())
        targets.wait_listening(self.process, self.port)


REQUEST = b"GET /small HTTP/1.1\r\nHost: bench\r\n\r\n"


async def _answer(reader: asyncio.StreamReader) -> int:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    length = next((int(v) for n, _, v in (ln.partition(":") for ln in lines[1:]) if n.lower() == "content-length"), 0)
    await reader.readexactly(length)
    return int(lines[0].split()[1])


async def _gauge(admin_port: int, name: str) -> float:
    async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{admin_port}/metrics") as resp:
        value = tracing_overhead.metric_sum(await resp.text(), name)
    return float(value or 0)


async def _until(check: Any, what: str) -> None:
    deadline = time.monotonic() + STEP_TIMEOUT_SECS
    while not await check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not within {STEP_TIMEOUT_SECS:g} s")
        await asyncio.sleep(0.02)


class ActivatorCost(Session):
    """The stand-in APIs, the long-lived router and activator, and each round's held cells."""

    def __init__(self, bench: Harness) -> None:
        super().__init__(bench)
        self.stack = contextlib.AsyncExitStack()
        self.awake_kube: fake_kube.FakeKube | None = None
        self.asleep_kube: fake_kube.FakeKube | None = None
        self.arms: list[targets.Router] = []

    def _modelservice(self, name: str) -> dict[str, Any]:
        port = self.bench.upstream_port
        return fake_kube.modelservice(port=port, namespace=NS, name=name)

    async def start(self) -> None:
        self.awake_kube = await self.stack.enter_async_context(fake_kube.kube_api())
        self.asleep_kube = await self.stack.enter_async_context(fake_kube.kube_api())
        self.awake_kube.services[(NS, AWAKE)] = self._modelservice(AWAKE)
        self.awake_kube.pods = [fake_kube.pod("127.0.0.1", f"{AWAKE}-0", namespace=NS)]
        router = targets.Router("router", "drain-router serve", drain_signal=signal.SIGTERM)
        activator = ActivatorTarget("activator", "drain-router activator", kube=self.awake_kube)
        for arm in (router, activator):
            await asyncio.to_thread(arm.start, self.bench.ctx, "-activator")
            self.arms.append(arm)
        # The first requests wake nothing (the pod is listed) but open the activator's site.
        await self.bench.small_get(activator, seconds=0.5)

    async def round(self, round_no: int) -> None:
        # A site idle for 60 s stops being watched: its next request would wait for a poll.
        await self.bench.small_get(self.arms[-1], seconds=0.5)
        for arm in self.arms:
            await self.bench.measure(
                round_no,
                "activator_small_get",
                arm,
                "requests",
                lambda t=arm: self.bench.small_get(t),
            )
        for name in ("router", "activator"):
            await self.held_cell(round_no, name)

    async def held_cell(self, round_no: int, name: str) -> None:
        bench, count = self.bench, self.bench.plan.activator_held
        kube = self.asleep_kube
        assert kube is not None
        if name == "router":
            args = ["--max-concurrent-requests", "1", "--queue-size", str(count)]
            fresh: targets.Router = targets.Router("router", "drain-router serve", extra_args=args)
        else:
            kube.services[(NS, ASLEEP)], kube.pods = self._modelservice(ASLEEP), []
            fresh = ActivatorTarget("activator", "drain-router activator", kube=kube, service=ASLEEP)
            fresh.extra_args = ["--queue-size", str(count)]
        writers: list[asyncio.StreamWriter] = []
        try:
            await asyncio.to_thread(fresh.start, bench.ctx, f"-held-r{round_no}")
            metrics = await self._held(fresh, name, count, writers)
        except Exception as exc:
            metrics = {"failed": f"{type(exc).__name__}: {exc}"}
        finally:
            for writer in writers:
                writer.close()
            await asyncio.to_thread(fresh.stop)
        bench.records.append({"round": round_no, "workload": "activator_held", "target": name, "metrics": metrics})
        bench.log(f"  r{round_no} activator_held   {name:<9} {metrics}")

    async def _held(
        self, target: targets.Router, name: str, count: int, writers: list[asyncio.StreamWriter]
    ) -> dict[str, Any]:
        assert target.pid is not None
        settle = self.bench.plan.hold_settle_secs
        slot: asyncio.StreamWriter | None = None
        if name == "router":  # the one slot, taken by a stream the upstream holds open
            reader, slot = await asyncio.open_connection("127.0.0.1", target.port)
            writers.append(slot)
            slot.write(b"GET /v1/completions?hold=1 HTTP/1.1\r\nHost: bench\r\n\r\n")
            await reader.readuntil(b"data: ")
        gauge = "drain_router_queue_depth" if name == "router" else "drain_router_activator_held_requests"
        await asyncio.sleep(settle)
        rss0 = procstat.rss_kib(procstat.tree(target.pid))
        meter = procstat.Meter(target.pid)
        meter.start()
        gate = asyncio.Semaphore(PARALLEL_CONNECTS)
        readers: list[asyncio.StreamReader] = []
        request = REQUEST

        async def one() -> None:
            async with gate:
                reader, writer = await asyncio.open_connection("127.0.0.1", target.port)
                writers.append(writer)
                readers.append(reader)
                writer.write(request)
                await writer.drain()

        await asyncio.gather(*(one() for _ in range(count)))
        await _until(lambda: self._at(target.admin_port, gauge, count), f"{count} held")
        hold_cpu = meter.stop() or 0.0
        await asyncio.sleep(settle)
        rss1 = procstat.rss_kib(procstat.tree(target.pid))

        meter.start()
        if slot is not None:
            slot.close()
        else:
            assert self.asleep_kube is not None
            self.asleep_kube.pods = [fake_kube.pod("127.0.0.1", f"{ASLEEP}-0", namespace=NS)]
        answers = await asyncio.wait_for(
            asyncio.gather(*(_answer(r) for r in readers), return_exceptions=True), STEP_TIMEOUT_SECS
        )
        release_cpu = meter.stop() or 0.0
        released = sum(1 for a in answers if a == 200)
        return {
            "held": count,
            "rss_base_kib": rss0,
            "rss_held_kib": rss1,
            "kib_per_held": (rss1 - rss0) / count,
            "cpu_us_per_held": hold_cpu / count * 1e6,
            "released": released,
            "cpu_us_per_released": release_cpu / released * 1e6 if released else None,
            "errors": count - released,
        }

    async def _at(self, admin_port: int, gauge: str, count: int) -> bool:
        return await _gauge(admin_port, gauge) >= count

    async def stop(self) -> None:
        for arm in self.arms:
            await asyncio.to_thread(arm.stop)
        await self.stack.aclose()


#: Its records: ``activator_small_get`` and ``activator_held``, on its own processes (the targets named
#: for the run are not started for it).
WORKLOADS = (
    Workload("activator", Group("activator", "activator"), session=ActivatorCost, suffixed=True, needs_targets=False),
)
