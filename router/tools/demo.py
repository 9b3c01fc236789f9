"""``drain-router demo``: a rolling restart with the drain and without it, on this machine.

The whole story with nothing but the package: a fake model server, router replicas (real
``drain-router serve`` processes), a small probe-driven balancer (:mod:`router.tools.balancer`),
clients streaming completions through it, and a rolling restart by SIGTERM, first with
``--shutdown-drain-secs`` set and then with 0. A live view shows each replica's state and in-flight
count (with rich, from the ``demo`` extra); at the end a table compares the runs, and with
matplotlib (the same extra) a PNG timeline is written.
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

from router.tools import balancer, cluster, load, runs
from router.tools.view import View

SAMPLE_SECS = 0.1
RENDER_SECS = 0.2


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Options:
    replicas: int = 2
    """Router replicas behind the balancer."""
    clients: int = 16
    """Concurrent streaming clients."""
    drain_secs: int = 2
    """``--shutdown-drain-secs`` of the first run (the second uses 0)."""
    probe_interval_ms: int = 500
    """The balancer's readiness probe period."""
    probe_fall: int = 2
    """Failed probes in a row before the balancer takes a replica out."""
    chunks: int = 20
    """Chunks per streamed completion."""
    interval_ms: int = 25
    """Milliseconds between chunks."""
    warmup_secs: float = 2.0
    """Load before the first SIGTERM, and after the last replica is back."""


# --------------------------------------------------------------------------------------------------
# One run: replicas, balancer, load, rolling restart.


class Scenario:
    """One run of the demo: start the replicas and the balancer, stream through it, restart the
    replicas one at a time with SIGTERM, and record what happened (:class:`runs.RunResult`)."""

    def __init__(
        self,
        label: str,
        drain_secs: int,
        opts: Options,
        model: cluster.FakeModel,
        session: aiohttp.ClientSession,
        view: View,
        log_dir: Path,
        run_index: int,
        runs_total: int,
    ) -> None:
        self.opts = opts
        self.session = session
        self.view = view
        self.drain_secs = drain_secs
        self.run_index, self.runs_total = run_index, runs_total
        self.replicas = [
            cluster.Replica(
                f"replica-{i}",
                model.url,
                log_dir / label.replace(" ", "-"),
                shutdown_drain_secs=drain_secs,
                upstream_health_path="/health",
            )
            for i in range(opts.replicas)
        ]
        self.result = runs.RunResult(label=label, drain_secs=drain_secs, replicas=[r.name for r in self.replicas])
        self.started = time.monotonic()
        self.wall_started = time.time()
        self.balancer = balancer.Balancer(
            [balancer.Backend(r.name, r.url, f"{r.url}/readyz") for r in self.replicas],
            probe_interval=opts.probe_interval_ms / 1000,
            fall=opts.probe_fall,
            rise=1,
            on_change=self._flipped,
        )
        self.load = load.Load("", clients=opts.clients, chunks=opts.chunks, interval_ms=opts.interval_ms)
        self.steps = ["warm-up", *[f"restart {r.name}" for r in self.replicas], "cool-down"]
        self._estimates = [opts.warmup_secs, *[drain_secs + 2.5] * len(self.replicas), opts.warmup_secs]
        self._step = 0
        self._step_started = time.monotonic()
        self._last_state = {r.name: "" for r in self.replicas}

    def now(self) -> float:
        return time.monotonic() - self.started

    # -- what the view and the record follow ---------------------------------------------------

    def _flipped(self, backend: balancer.Backend, up: bool) -> None:
        self.result.rotation.append((self.now(), backend.name, up))
        self.view.replicas[backend.name].in_rotation = up
        self.view.event(f"balancer: {backend.name} {'in rotation' if up else 'out of rotation'}")

    def _set_step(self, index: int) -> None:
        self._step, self._step_started = index, time.monotonic()
        self.view.step = self.steps[index]

    def _progress(self) -> float:
        within = min(0.95, (time.monotonic() - self._step_started) / self._estimates[self._step])
        return (self.run_index + (self._step + within) / len(self.steps)) / self.runs_total

    async def _sample(self, replica: cluster.Replica) -> None:
        try:
            body = await replica.inflight(self.session)
            state, inflight = str(body["state"]), int(body["inflight"])
        except (TimeoutError, aiohttp.ClientError, OSError, KeyError, ValueError, TypeError):
            state, inflight = ("exited" if not replica.process.alive else "down"), 0
        t = self.now()
        self.result.samples.append(runs.Sample(t, replica.name, state, inflight))
        self.view.replicas[replica.name].state = state
        self.view.replicas[replica.name].inflight = inflight
        if state != self._last_state[replica.name]:
            self._last_state[replica.name] = state
            self.result.marks.append(runs.Mark(t, replica.name, state))
            if state == "closing":
                self.view.event(f"{replica.name} closing: listener shut, {inflight} in flight finishing")

    async def _sampler(self) -> None:
        while True:
            await asyncio.gather(*(self._sample(r) for r in self.replicas))
            self.view.done = len(self.load.records)
            self.view.lost = len(self.load.lost)
            await asyncio.sleep(SAMPLE_SECS)

    async def _renderer(self) -> None:
        while True:
            self.view.progress = self._progress()
            self.view.draw()
            await asyncio.sleep(RENDER_SECS)

    async def _in_rotation(self, replica: cluster.Replica) -> None:
        backend = next(b for b in self.balancer.backends if b.name == replica.name)

        async def taken_back() -> bool:
            return backend.in_rotation

        await cluster.wait_until(taken_back, timeout=15, what=f"the balancer to take {replica.name} back")

    # -- the run ---------------------------------------------------------------------------------

    async def _restart(self, replica: cluster.Replica) -> None:
        t_sig = self.now()
        self.result.marks.append(runs.Mark(t_sig, replica.name, "sigterm"))
        self.view.event(f"SIGTERM {replica.name} ({self.view.replicas[replica.name].inflight} in flight)")
        replica.sigterm()
        code = await replica.process.wait_exit(timeout=self.drain_secs + 60)
        self.result.exit_codes.append(code)
        self.result.drain_durations.append(self.now() - t_sig)
        self.result.marks.append(runs.Mark(self.now(), replica.name, "exit"))
        self.view.event(f"{replica.name} exited {code} after {self.now() - t_sig:.1f}s; starting it again")
        await replica.start(self.session)
        await self._in_rotation(replica)

    async def run(self) -> runs.RunResult:
        opts, view = self.opts, self.view
        view.start_run(
            f"drain-router demo, run {self.run_index + 1}/{self.runs_total}: {self.result.label} "
            f"(--shutdown-drain-secs {self.drain_secs})",
            self.result.replicas,
            self.started,
        )
        background: list[asyncio.Task[None]] = []
        try:
            await asyncio.gather(*(r.start(self.session) for r in self.replicas))
            await self.balancer.start()
            await asyncio.gather(*(self._in_rotation(r) for r in self.replicas))
            background = [asyncio.create_task(self._sampler()), asyncio.create_task(self._renderer())]
            view.event(
                f"{len(self.replicas)} replicas ready; balancer probes /readyz every "
                f"{opts.probe_interval_ms} ms (fall {opts.probe_fall}); {opts.clients} clients streaming"
            )
            self.load.url = self.balancer.url
            await self.load.start()
            self._set_step(0)
            await asyncio.sleep(opts.warmup_secs)
            for i, replica in enumerate(self.replicas, start=1):
                self._set_step(i)
                await self._restart(replica)
            self._set_step(len(self.steps) - 1)
            await asyncio.sleep(opts.warmup_secs)
        finally:
            await self._stop(background)
        return self._finish()

    async def _stop(self, background: list[asyncio.Task[None]]) -> None:
        await self.load.stop()
        for task in background:
            task.cancel()
        for task in background:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.balancer.stop()
        for replica in self.replicas:
            replica.process.kill()
        for backend in self.balancer.backends:
            self.result.balancer_errors.update(backend.errors)

    def _finish(self) -> runs.RunResult:
        result, view = self.result, self.view
        result.duration = self.now()
        logged = [
            runs.Mark(t, r.name, "closing")
            for r in self.replicas
            for t in runs.closing_times(r.process.log_path, self.wall_started)
        ]
        if logged:  # the router's own drain.closing events are exact; sampling can miss a short closing
            result.marks = [m for m in result.marks if m.kind != "closing"] + logged
        result.records = [
            dataclasses.replace(r, started=r.started - self.started, finished=r.finished - self.started)
            for r in self.load.records
        ]
        view.done, view.lost = len(result.records), len(result.lost)
        for rv in view.replicas.values():
            rv.state, rv.inflight, rv.in_rotation = "stopped", 0, False
        view.progress = (self.run_index + 1) / self.runs_total
        view.step = "done"
        view.event(f"done: {len(result.records)} requests, {len(result.lost)} lost")
        view.end_run()
        return result


async def run_demo(opts: Options, out: TextIO, *, live: bool, png: Path | None) -> int:
    view = View(out, live=live)
    runs_spec = [("drain on", opts.drain_secs), ("drain off", 0)]
    with tempfile.TemporaryDirectory(prefix="drain-router-demo-") as tmp:
        log_dir = Path(tmp)
        model = cluster.FakeModel(log_dir, chunks=opts.chunks, interval_ms=opts.interval_ms)
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as session:
            try:
                out.write(
                    f"Starting a fake model server ({opts.chunks} chunks every {opts.interval_ms} ms "
                    f"a stream), {opts.replicas} router replicas and a balancer on 127.0.0.1...\n"
                )
                out.flush()
                await model.start(session)
                results = [
                    await Scenario(label, secs, opts, model, session, view, log_dir, i, len(runs_spec)).run()
                    for i, (label, secs) in enumerate(runs_spec)
                ]
            except (cluster.ProcessFailed, TimeoutError) as exc:
                view.close()
                out.write(f"\ndemo failed: {exc}\n")
                return 1
            finally:
                model.process.kill()
    out.write("\n" + runs.comparison_table(results) + "\n\n")
    on, off = results
    out.write(
        f"With a {opts.drain_secs} s drain, the replicas kept serving while the balancer's probes "
        f"took them out of rotation:\n{len(on.lost)} of {len(on.records)} requests lost. Without it, "
        f"{len(off.lost)} of {len(off.records)} were lost: sent to a replica that had already "
        f"closed its listener.\n"
    )
    if png is not None:
        from router.tools import timeline

        try:
            timeline.plot(results, png)
            out.write(f"\nTimeline written to {png}\n")
        except timeline.PlotUnavailable:
            out.write("\nNo PNG timeline: matplotlib is not installed (pip install 'drain-router[demo]').\n")
    out.flush()
    return 1 if on.lost else 0


@click.command("demo")
@click.option("--replicas", default=2, show_default=True, type=click.IntRange(2, 6), help="Router replicas.")
@click.option(
    "--clients", default=16, show_default=True, type=click.IntRange(1, 500), help="Concurrent streaming clients."
)
@click.option(
    "--drain-secs",
    default=2,
    show_default=True,
    type=click.IntRange(1, 60),
    help="--shutdown-drain-secs of the first run; the second run uses 0.",
)
@click.option(
    "--probe-interval-ms",
    default=500,
    show_default=True,
    type=click.IntRange(50, 10_000),
    help="The balancer's /readyz probe period.",
)
@click.option(
    "--probe-fall",
    default=2,
    show_default=True,
    type=click.IntRange(1, 10),
    help="Failed probes before the balancer takes a replica out of rotation.",
)
@click.option(
    "--chunks", default=20, show_default=True, type=click.IntRange(1, 10_000), help="Chunks per streamed completion."
)
@click.option(
    "--interval-ms", default=25, show_default=True, type=click.IntRange(0, 10_000), help="Milliseconds between chunks."
)
@click.option(
    "--png",
    "png",
    default="drain-router-demo.png",
    show_default=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="Where to write the timeline (needs the 'plot' extra).",
)
@click.option("--no-png", is_flag=True, default=False, help="Do not write the timeline.")
@click.option(
    "--live/--plain", default=None, help="A redrawn live view, or plain event lines. Default: live on a terminal."
)
def command(
    replicas: int,
    clients: int,
    drain_secs: int,
    probe_interval_ms: int,
    probe_fall: int,
    chunks: int,
    interval_ms: int,
    png: Path,
    no_png: bool,
    live: bool | None,
) -> None:
    """Show a rolling restart with and without the drain, on this machine.

    Starts a fake model server, router replicas and a probe-driven balancer on 127.0.0.1, streams
    completions through it, and restarts the replicas one at a time with SIGTERM: first with
    --shutdown-drain-secs DRAIN_SECS, then with 0. Prints a comparison, writes a PNG timeline.
    Exits 1 if the drained run lost a request.
    """
    if drain_secs * 1000 <= probe_interval_ms * probe_fall:
        click.echo(
            f"note: a {drain_secs} s drain is not longer than the balancer's removal window "
            f"({probe_interval_ms} ms x {probe_fall}); expect losses in both runs.",
            err=True,
        )
    opts = Options(
        replicas=replicas,
        clients=clients,
        drain_secs=drain_secs,
        probe_interval_ms=probe_interval_ms,
        probe_fall=probe_fall,
        chunks=chunks,
        interval_ms=interval_ms,
    )
    is_live = sys.stdout.isatty() if live is None else live
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        code = runner.run(run_demo(opts, sys.stdout, live=is_live, png=None if no_png else png))
    sys.exit(code)
