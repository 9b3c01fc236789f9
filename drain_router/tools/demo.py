"""``drain-router demo``: a rolling restart under three shutdown recipes, on this machine.

The whole story with nothing but the package: clients stream completions through a small
probe-driven balancer (:mod:`drain_router.tools.balancer`) to two pods, and the pods are restarted one at
a time, once per recipe (:mod:`drain_router.tools.recipes`): drain-router, preStop sleep + engine drain
(KServe's recipe, its windows scaled as the drain is) behind a balancer told of the pod's deletion
and again behind one that probes only the engine, and no drain. A live view shows each pod's
state and in-flight count (with rich, from the ``demo`` extra); at the end a table compares the
runs, and with matplotlib (the same extra) a PNG timeline is written.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import sys
import tempfile
import time
from pathlib import Path
from typing import TextIO

import aiohttp
import click
import uvloop

from drain_router.tools import balancer, cluster, load, realtime, recipes, runs
from drain_router.tools.process import ProcessFailed, wait_until
from drain_router.tools.view import View

SAMPLE_SECS = 0.1
RENDER_SECS = 0.2


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


#: With realtime sessions, the routers declare this much more than their drain window as their
#: termination grace: sessions still open at the in-flight deadline (grace - 2 s) get a Close 1001.
REALTIME_GRACE_EXTRA_SECS = 4


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
    ) -> None:
        self.opts, self.session, self.view = opts, session, view
        self.sessions = (
            realtime.Sessions("", clients=opts.realtime_clients, deltas=opts.chunks, interval_ms=opts.interval_ms)
            if with_sessions and opts.realtime_clients
            else None
        )
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
            [balancer.Backend(p.name, p.url, p.probe_url) for p in self.pods],
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

    async def _sample(self, pod: recipes.Pod) -> None:
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
                self.view.sessions = _sessions_line(self.sessions)
            await asyncio.sleep(SAMPLE_SECS)

    async def _renderer(self) -> None:
        while True:
            within = min(0.95, (time.monotonic() - self._step_started) / self._estimates[self._step])
            self.view.progress = (self.run_index + (self._step + within) / len(self.steps)) / self.run_count
            self.view.draw()
            await asyncio.sleep(RENDER_SECS)

    async def _in_rotation(self, pod: recipes.Pod) -> None:
        backend = self.backends[pod.name]

        async def taken_back() -> bool:
            return backend.in_rotation

        await wait_until(taken_back, timeout=15, what=f"the balancer to take {pod.name} back")

    async def _restart(self, pod: recipes.Pod) -> None:
        t0 = self.now()
        self.result.marks.append(runs.Mark(t0, pod.name, "sigterm"))
        self.view.event(f"{self.recipe.t0_name} {pod.name} ({self.backends[pod.name].active} in flight)")
        code = await pod.terminate()
        self.result.exit_codes.append(code)
        self.result.drain_durations.append(self.now() - t0)
        self.result.marks.append(runs.Mark(self.now(), pod.name, "exit"))
        self.view.event(f"{pod.name} exited {code} after {self.now() - t0:.1f}s; starting it again")
        await pod.start(self.session)
        await self._in_rotation(pod)

    async def run(self) -> runs.RunResult:
        opts, view = self.opts, self.view
        title = (
            f"drain-router demo, run {self.run_index + 1}/{self.run_count}: {self.recipe.label} ({self.recipe.setting})"
        )
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
        result.records = [
            dataclasses.replace(r, started=r.started - self.started, finished=r.finished - self.started)
            for r in self.load.records
        ]
        if self.sessions is not None:
            result.sessions = [
                dataclasses.replace(r, started=r.started - self.started, finished=r.finished - self.started)
                for r in self.sessions.records
            ]
            view.sessions = _sessions_line(self.sessions)
        view.done, view.lost = len(result.records), len(result.lost)
        for rv in view.replicas.values():
            rv.state, rv.inflight, rv.in_rotation = "stopped", 0, False
        view.progress, view.step = (self.run_index + 1) / self.run_count, "done"
        view.event(f"done: {len(result.records)} requests, {len(result.lost)} lost; pods and balancer stopped")
        view.end_run()
        return result


def _sessions_line(holder: realtime.Sessions) -> str:
    ended = holder.records
    going_away = sum(1 for r in ended if r.end.reconnect)
    cut = sum(1 for r in ended if not r.end.clean)
    return f"{holder.open} open, {going_away} ended 1001 (reconnected), {cut} cut"


async def run_demo(opts: Options, out: TextIO, *, live: bool, png: Path | None) -> int:
    view = View(out, live=live)
    with tempfile.TemporaryDirectory(prefix="drain-router-demo-") as tmp:
        log_dir = Path(tmp)
        model = cluster.FakeModel(log_dir, chunks=opts.chunks, interval_ms=opts.interval_ms)
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as session:
            try:
                out.write(
                    f"Streaming completions ({opts.chunks} chunks every {opts.interval_ms} ms) through a "
                    f"balancer to {opts.replicas} pods on 127.0.0.1, restarted under three recipes (the sleep "
                    "recipe behind two balancers)...\n"
                )
                out.flush()
                await model.start(session)
                with_sessions = opts.realtime_clients > 0
                grace = opts.drain_secs + REALTIME_GRACE_EXTRA_SECS if with_sessions else None
                compared = recipes.compared(
                    model.url,
                    replicas=opts.replicas,
                    drain_secs=opts.drain_secs,
                    chunks=opts.chunks,
                    interval_ms=opts.interval_ms,
                    termination_grace_secs=grace,
                )
                results = [
                    await Scenario(
                        recipe, opts, session, view, log_dir, i, of=len(compared), with_sessions=with_sessions
                    ).run()
                    for i, recipe in enumerate(compared)
                ]
            except (ProcessFailed, TimeoutError) as exc:
                view.close()
                out.write(f"\ndemo failed: {exc}\n")
                return 1
            finally:
                model.process.kill()
    out.write("\n" + runs.comparison_table(results) + "\n\n" + runs.summary(results) + "\n")
    if png is not None:
        from drain_router.tools import timeline

        try:
            timeline.plot(results, png)
            out.write(f"\nTimeline written to {png}\n")
        except timeline.PlotUnavailable:
            out.write("\nNo PNG timeline: matplotlib is not installed (pip install 'drain-router[demo]').\n")
    out.flush()
    return 1 if results[0].lost or any(not r.end.clean for r in results[0].sessions) else 0


@click.command("demo")
@click.option("--replicas", default=2, show_default=True, type=click.IntRange(2, 6), help="Pods per run.")
@click.option("--clients", default=16, show_default=True, type=click.IntRange(1, 500), help="Streaming clients.")
@click.option(
    "--drain-secs",
    default=2,
    show_default=True,
    type=click.IntRange(1, 60),
    help="--shutdown-drain-secs of the drain-router run; the sleep recipe's windows scale with it (DRAIN_SECS/30).",
)
@click.option(
    "--probe-interval-ms", default=500, show_default=True, type=click.IntRange(50, 10_000), help="Probe period."
)
@click.option(
    "--probe-fall",
    default=2,
    show_default=True,
    type=click.IntRange(1, 10),
    help="Failed probes before the balancer takes a pod out of rotation.",
)
@click.option(
    "--realtime-clients",
    default=4,
    show_default=True,
    type=click.IntRange(0, 500),
    help="Realtime (WebSocket) sessions beside the streams, when the router tunnels WebSocket; 0: none.",
)
@click.option("--chunks", default=20, show_default=True, type=click.IntRange(1, 10_000), help="Chunks per stream.")
@click.option(
    "--interval-ms", default=50, show_default=True, type=click.IntRange(0, 10_000), help="Milliseconds between chunks."
)
@click.option(
    "--png",
    "png",
    default="drain-router-demo.png",
    show_default=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="Where to write the timeline (needs the 'demo' extra).",
)
@click.option("--no-png", is_flag=True, default=False, help="Do not write the timeline.")
@click.option(
    "--live/--plain", default=None, help="A redrawn live view, or plain event lines. Default: live on a terminal."
)
def command(png: Path, no_png: bool, live: bool | None, **params: int) -> None:
    """Show a rolling restart under three shutdown recipes, on this machine.

    Streams completions through a probe-driven balancer to two pods on 127.0.0.1 and restarts them
    one at a time: with drain-router (--shutdown-drain-secs DRAIN_SECS); with KServe's preStop sleep
    and the engine's own drain (vLLM's --shutdown-timeout; 15 s and 45 s scaled by DRAIN_SECS/30),
    once with the balancer told of the pod's deletion and once with a balancer that probes only the
    engine; and with no drain. Realtime sessions run beside the streams and the table says how each
    ended. Prints a comparison and what each run lost, writes a PNG timeline. Exits 1 if
    drain-router lost a request or cut a session.
    """
    opts = Options(**params)
    if opts.drain_secs * 1000 <= opts.probe_interval_ms * opts.probe_fall:
        click.echo(
            f"note: a {opts.drain_secs} s drain is not longer than the balancer's removal window "
            f"({opts.probe_interval_ms} ms x {opts.probe_fall}); expect losses in every run.",
            err=True,
        )
    is_live = sys.stdout.isatty() if live is None else live
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        code = runner.run(run_demo(opts, sys.stdout, live=is_live, png=None if no_png else png))
    sys.exit(code)
