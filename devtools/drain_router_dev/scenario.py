"""One run of the demo: start the pods and the balancer, stream through it, restart the pods one at
a time, and record what happened (:class:`Scenario`), configured by the demo's :class:`Options`.

:mod:`drain_router_dev.demo` runs one :class:`Scenario` per recipe and renders the comparison; a run's
own orchestration (start, warm-up, restarts, cool-down, the sampler and the live view's progress)
lives here.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import aiohttp

from drain_router_dev import balancer, load, pods, realtime, recipes, runs
from drain_router_dev.process import wait_until
from drain_router_dev.view import View

if TYPE_CHECKING:  # grpcio (the devtools distribution's dependencies) loads only when a run makes gRPC calls
    from drain_router_dev import grpc_load

SAMPLE_SECS = 0.1
RENDER_SECS = 0.2

#: What a client records about one request, session or gRPC call, timed on the monotonic clock.
_Timed = TypeVar("_Timed", load.Record, realtime.Record, "grpc_load.Record")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Options:
    replicas: int = 2
    """Pods behind the balancer."""
    clients: int = 16
    """Concurrent streaming clients."""
    drain_secs: int = 2
    """``--shutdown-drain-secs`` of the drain-router run; it also sets the scale of the sleep recipe."""
    probe_interval_ms: int = 500
    """The balancer's readiness probe period."""
    probe_fall: int = 2
    """Failed probes in a row before the balancer takes a pod out."""
    chunks: int = 20
    """Chunks per streamed completion."""
    interval_ms: int = 50
    """Milliseconds between chunks: 20 x 50 ms, 1 s streams, stand for completions of about 30 s, so
    streams are still running when the sleep recipe's engine gets SIGTERM, as they are in production."""
    warmup_secs: float = 1.0
    """Load before the first restart, and after the last pod is back: one stream's length, by which
    every staggered client is streaming (the load stops by letting each stream finish, so the end
    needs no more). Four runs then take under a minute."""
    realtime_clients: int = 4
    """Realtime (WebSocket) sessions held open beside the streams, each asking for one response
    after another; only when the router tunnels WebSocket (probed once at the start)."""
    grpc_clients: int = 4
    """gRPC clients calling vLLM's ``Generate`` (``chunks`` tokens) back to back through the
    balancer's gRPC side beside the streams; only with grpcio installed (the devtools distribution's dependencies)."""


class Scenario:
    """One run: start the pods and the balancer, stream through it, restart the pods one at a time,
    and record what happened (:class:`runs.RunResult`)."""

    def __init__(
        self,
        recipe: recipes.Recipe,
        opts: Options,
        session: aiohttp.ClientSession,
        view: View,
        log_dir: Path,
        index: int,
        *,
        of: int,
        with_sessions: bool = False,
        with_grpc: bool = False,
    ) -> None:
        self.opts, self.session, self.view = opts, session, view
        self.sessions = (
            realtime.Sessions("", clients=opts.realtime_clients, deltas=opts.chunks, interval_ms=opts.interval_ms)
            if with_sessions and opts.realtime_clients
            else None
        )
        self.grpc: grpc_load.GrpcLoad | None = None
        if with_grpc and opts.grpc_clients:
            from drain_router_dev import grpc_load

            self.grpc = grpc_load.GrpcLoad("", clients=opts.grpc_clients, tokens=opts.chunks)
        self.recipe, self.run_index, self.run_count = recipe, index, of
        self.pods = recipe.pods(log_dir / recipe.label.replace(" ", "-").replace("+", "and"))
        self.result = runs.RunResult(
            label=recipe.label,
            setting=recipe.setting,
            note=recipe.note,
            replicas=[p.name for p in self.pods],
            t0_name=recipe.t0_name,
            closing_name=recipe.closing_name,
            probe_name=recipe.probe_name,
        )
        self.started, self.wall_started = time.monotonic(), time.time()
        self.balancer = balancer.Balancer(
            [balancer.Backend(p.name, p.url, p.probe_url, p.grpc_target) for p in self.pods],
            probe_interval=opts.probe_interval_ms / 1000,
            fall=opts.probe_fall,
            rise=1,
            on_change=self._flipped,
        )
        self.backends = {b.name: b for b in self.balancer.backends}
        self.load = load.Load("", clients=opts.clients, chunks=opts.chunks, interval_ms=opts.interval_ms, stagger=True)
        self.steps = ["warm-up", *[f"restart {p.name}" for p in self.pods], "cool-down"]
        self._estimates = [opts.warmup_secs, *[recipe.window_secs + 2.5] * len(self.pods), opts.warmup_secs]
        self._step, self._step_started = 0, time.monotonic()
        self._last_state = {p.name: "" for p in self.pods}

    def now(self) -> float:
        return time.monotonic() - self.started

    def _flipped(self, backend: balancer.Backend, up: bool) -> None:
        self.result.rotation.append((self.now(), backend.name, up))
        self.view.replicas[backend.name].in_rotation = up
        self.view.event(f"balancer: {backend.name} {'in rotation' if up else 'out of rotation'}")

    def _set_step(self, index: int) -> None:
        self._step, self._step_started = index, time.monotonic()
        self.view.step = self.steps[index]

    async def _sample(self, pod: pods.Pod) -> None:
        state, inflight = await pod.state(self.session), self.backends[pod.name].active
        t = self.now()
        self.result.samples.append(runs.Sample(t, pod.name, state, inflight))
        self.view.replicas[pod.name].state, self.view.replicas[pod.name].inflight = state, inflight
        if state != self._last_state[pod.name]:
            self._last_state[pod.name] = state
            self.result.marks.append(runs.Mark(t, pod.name, state))

    async def _sampler(self) -> None:
        while True:
            await asyncio.gather(*(self._sample(p) for p in self.pods))
            self.view.done, self.view.lost = len(self.load.records), len(self.load.lost)
            if self.sessions is not None:
                self.view.sessions = sessions_line(self.sessions)
            if self.grpc is not None:
                self.view.grpc = grpc_line(self.grpc.records)
            await asyncio.sleep(SAMPLE_SECS)

    async def _renderer(self) -> None:
        while True:
            within = min(0.95, (time.monotonic() - self._step_started) / self._estimates[self._step])
            self.view.progress = (self.run_index + (self._step + within) / len(self.steps)) / self.run_count
            self.view.draw()
            await asyncio.sleep(RENDER_SECS)

    async def _in_rotation(self, pod: pods.Pod) -> None:
        backend = self.backends[pod.name]

        async def taken_back() -> bool:
            return backend.in_rotation

        await wait_until(taken_back, timeout=15, what=f"the balancer to take {pod.name} back")

    async def _restart(self, pod: pods.Pod) -> None:
        t0 = self.now()
        self.result.marks.append(runs.Mark(t0, pod.name, "sigterm"))
        self.view.event(f"{self.recipe.t0_name} {pod.name} ({self.backends[pod.name].active} in flight)")
        code = await pod.terminate()
        self.result.exit_codes.append(code)
        self.result.drain_durations.append(self.now() - t0)
        self.result.marks.append(runs.Mark(self.now(), pod.name, "exit"))
        self.view.event(
            f"{pod.name} exited {code} ({pod.exit_meaning(code)}) after {self.now() - t0:.1f}s; starting it again"
        )
        await pod.start(self.session)
        await self._in_rotation(pod)

    async def run(self) -> runs.RunResult:
        opts, view = self.opts, self.view
        title = f"drain-router-dev demo, run {self.run_index + 1}/{self.run_count}: {self.recipe.label} ({self.recipe.setting})"
        view.start_run(title, self.result.replicas, self.started)
        background: list[asyncio.Task[None]] = []
        try:
            await asyncio.gather(*(p.start(self.session) for p in self.pods))
            await self.balancer.start()
            await asyncio.gather(*(self._in_rotation(p) for p in self.pods))
            background = [asyncio.create_task(self._sampler()), asyncio.create_task(self._renderer())]
            view.event(
                f"{len(self.pods)} pods ready; balancer probes their readiness every "
                f"{opts.probe_interval_ms} ms (fall {opts.probe_fall}); {opts.clients} clients streaming"
            )
            self.load.url = self.balancer.url
            await self.load.start()
            if self.sessions is not None:
                self.sessions.url = self.balancer.url
                await self.sessions.start()
                view.event(f"{self.sessions.clients} realtime sessions open beside the streams")
            if self.grpc is not None:
                self.grpc.target = self.balancer.grpc_target
                await self.grpc.start()
                view.event(f"{self.grpc.clients} gRPC clients calling Generate through the balancer's gRPC side")
            self._set_step(0)
            await asyncio.sleep(opts.warmup_secs)
            for i, pod in enumerate(self.pods, start=1):
                self._set_step(i)
                await self._restart(pod)
            self._set_step(len(self.steps) - 1)
            await asyncio.sleep(opts.warmup_secs)
        finally:
            await self._stop(background)
        return self._finish()

    async def _stop(self, background: list[asyncio.Task[None]]) -> None:
        await self.load.stop()
        if self.sessions is not None:
            await self.sessions.stop()
        if self.grpc is not None:
            await self.grpc.stop()
        for task in background:
            task.cancel()
        for task in background:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.balancer.stop()
        for pod in self.pods:
            await pod.close()
        for backend in self.balancer.backends:
            self.result.balancer_errors.update(backend.errors)

    def _finish(self) -> runs.RunResult:
        result, view = self.result, self.view
        result.duration = self.now()
        # Exact closing times (the routers' drain.closing events, the engines' SIGTERMs): sampling
        # can miss a short closing.
        exact = [runs.Mark(t, p.name, "closing") for p in self.pods for t in p.closing_times(self.wall_started)]
        result.marks = [m for m in result.marks if m.kind != "closing"] + exact
        result.records = _since(self.load.records, self.started)
        if self.sessions is not None:
            result.sessions = _since(self.sessions.records, self.started)
            view.sessions = sessions_line(self.sessions)
        if self.grpc is not None:
            result.grpc = _since(self.grpc.records, self.started)
            view.grpc = grpc_line(result.grpc)
        view.done, view.lost = len(result.records), len(result.lost)
        for rv in view.replicas.values():
            rv.state, rv.inflight, rv.in_rotation = "stopped", 0, False
        view.progress, view.step = (self.run_index + 1) / self.run_count, "done"
        calls = f", {len(result.grpc)} gRPC calls, {len(result.grpc_lost)} lost" if self.grpc is not None else ""
        view.event(f"done: {len(result.records)} requests, {len(result.lost)} lost{calls}; pods and balancer stopped")
        view.end_run()
        return result


def _since(records: list[_Timed], t0: float) -> list[_Timed]:
    """``records`` with their start and finish as seconds since ``t0`` (the run's start), as a run
    result keeps them, rather than on the monotonic clock."""
    return [dataclasses.replace(r, started=r.started - t0, finished=r.finished - t0) for r in records]


def sessions_line(holder: realtime.Sessions) -> str:
    """The live view's line about the realtime sessions: open, ended 1001, cut."""
    ended = holder.records
    going_away = sum(1 for r in ended if r.end.reconnect)
    cut = sum(1 for r in ended if not r.end.clean)
    return f"{holder.open} open, {going_away} ended 1001 (reconnected), {cut} cut"


def grpc_line(records: list[grpc_load.Record]) -> str:
    """The live view's line about the gRPC calls: done, lost."""
    return f"{len(records)} done, {sum(1 for r in records if r.outcome.lost)} lost"
