"""``drain-router demo``: a rolling restart with the drain and without it, on this machine.

The whole story with nothing but the package: a fake model server, router replicas (real
``drain-router serve`` processes), a small probe-driven balancer (:mod:`router.tools.balancer`),
clients streaming completions through it, and a rolling restart by SIGTERM, first with
``--shutdown-drain-secs`` set and then with 0. A live view shows each replica's state and in-flight
count; at the end a table compares the runs, and with the ``plot`` extra a PNG timeline is written.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import json
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import TextIO

import aiohttp
import click
import uvloop

from router.tools import balancer, cluster, load

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


@dataclasses.dataclass(frozen=True, slots=True)
class Sample:
    t: float
    replica: str
    state: str
    inflight: int


@dataclasses.dataclass(frozen=True, slots=True)
class Mark:
    t: float
    replica: str
    kind: str
    """``sigterm``, ``draining``, ``closing``, ``exited``, ``serving``..."""


@dataclasses.dataclass(slots=True)
class RunResult:
    label: str
    drain_secs: int
    replicas: list[str]
    duration: float = 0.0
    records: list[load.Record] = dataclasses.field(default_factory=list)
    samples: list[Sample] = dataclasses.field(default_factory=list)
    marks: list[Mark] = dataclasses.field(default_factory=list)
    rotation: list[tuple[float, str, bool]] = dataclasses.field(default_factory=list)
    drain_durations: list[float] = dataclasses.field(default_factory=list)
    exit_codes: list[int] = dataclasses.field(default_factory=list)
    balancer_errors: Counter[str] = dataclasses.field(default_factory=Counter)
    """Why the balancer answered 502 or cut a stream, by exception type."""

    @property
    def lost(self) -> list[load.Record]:
        return [r for r in self.records if r.outcome.lost]


# --------------------------------------------------------------------------------------------------
# The view: a redrawn frame on a terminal, event lines otherwise.


@dataclasses.dataclass(slots=True)
class ReplicaView:
    state: str = "starting"
    inflight: int = 0
    in_rotation: bool = False


class View:
    def __init__(self, out: TextIO, *, live: bool) -> None:
        self.out = out
        self.live = live
        self.title = ""
        self.step = ""
        self.progress = 0.0
        self.replicas: dict[str, ReplicaView] = {}
        self.done = 0
        self.lost = 0
        self.events: list[str] = []
        self._lines_drawn = 0
        self._run_started = time.monotonic()

    def start_run(self, title: str, replicas: list[str], started: float) -> None:
        self.title = title
        self.replicas = {name: ReplicaView() for name in replicas}
        self.done = self.lost = 0
        self._run_started = started
        if not self.live:
            self.out.write(f"\n== {title}\n")
            self.out.flush()

    def event(self, text: str) -> None:
        line = f"{time.monotonic() - self._run_started:6.1f}s  {text}"
        self.events = (self.events + [line])[-6:]
        if not self.live:
            self.out.write(line + "\n")
            self.out.flush()

    def draw(self) -> None:
        if not self.live:
            return
        width = 32
        filled = int(round(self.progress * width))
        lines = [
            f"\033[1m{self.title}\033[0m",
            f" [{'█' * filled}{'░' * (width - filled)}] {self.progress * 100:3.0f}%  {self.step}",
            f" {'replica':<11}{'state':<11}{'in-flight':>9}   balancer",
        ]
        for name, rv in self.replicas.items():
            rotation = "\033[32min rotation\033[0m" if rv.in_rotation else "\033[31mout\033[0m"
            lines.append(f" {name:<11}{rv.state:<11}{rv.inflight:>9}   {rotation}")
        lost = f"\033[31m{self.lost} lost\033[0m" if self.lost else "0 lost"
        lines.append(f" requests   {self.done} done, {lost}")
        lines += ["", *[f" {e}" for e in self.events]]
        self.clear()
        self.out.write("\n".join(f"{line}\033[K" for line in lines) + "\n")
        self.out.flush()
        self._lines_drawn = len(lines)

    def clear(self) -> None:
        if self.live and self._lines_drawn:
            self.out.write(f"\033[{self._lines_drawn}F\033[J")
            self._lines_drawn = 0

    def end_run(self) -> None:
        if self.live:
            self.draw()
            self._lines_drawn = 0  # keep the last frame on screen
        self.out.write("\n" if self.live else "")
        self.out.flush()


# --------------------------------------------------------------------------------------------------
# One run: replicas, balancer, load, rolling restart.


async def run_scenario(label: str, drain_secs: int, opts: Options, model: cluster.FakeModel,
                       session: aiohttp.ClientSession, view: View, log_dir: Path,
                       run_index: int, runs: int) -> RunResult:
    replicas = [cluster.Replica(f"replica-{i}", model.url, log_dir / label.replace(" ", "-"),
                                shutdown_drain_secs=drain_secs, upstream_health_path="/health")
                for i in range(opts.replicas)]
    result = RunResult(label=label, drain_secs=drain_secs, replicas=[r.name for r in replicas])
    started = time.monotonic()
    wall_started = time.time()
    now = lambda: time.monotonic() - started  # noqa: E731

    def flipped(backend: balancer.Backend, up: bool) -> None:
        result.rotation.append((now(), backend.name, up))
        view.replicas[backend.name].in_rotation = up
        view.event(f"balancer: {backend.name} {'in rotation' if up else 'out of rotation'}")

    lb = balancer.Balancer([balancer.Backend(r.name, r.url, f"{r.url}/readyz") for r in replicas],
                           probe_interval=opts.probe_interval_ms / 1000, fall=opts.probe_fall, rise=1,
                           on_change=flipped)
    steps = ["warm-up", *[f"restart {r.name}" for r in replicas], "cool-down"]
    step_estimates = [opts.warmup_secs, *[drain_secs + 2.5] * len(replicas), opts.warmup_secs]
    step_index = 0
    step_started = time.monotonic()

    def set_step(i: int) -> None:
        nonlocal step_index, step_started
        step_index, step_started = i, time.monotonic()
        view.step = steps[i]

    def progress() -> float:
        within = min(0.95, (time.monotonic() - step_started) / step_estimates[step_index])
        return (run_index + (step_index + within) / len(steps)) / runs

    view.start_run(f"drain-router demo, run {run_index + 1}/{runs}: {label} "
                   f"(--shutdown-drain-secs {drain_secs})", result.replicas, started)
    stream_load = load.Load("", clients=opts.clients, chunks=opts.chunks, interval_ms=opts.interval_ms)
    last_state = {r.name: "" for r in replicas}

    async def sample_one(replica: cluster.Replica) -> None:
        try:
            body = await replica.inflight(session)
            state, inflight = str(body["state"]), int(body["inflight"])
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError, KeyError, ValueError, TypeError):
            state, inflight = ("exited" if not replica.process.alive else "down"), 0
        t = now()
        result.samples.append(Sample(t, replica.name, state, inflight))
        view.replicas[replica.name].state = state
        view.replicas[replica.name].inflight = inflight
        if state != last_state[replica.name]:
            last_state[replica.name] = state
            result.marks.append(Mark(t, replica.name, state))
            if state == "closing":
                view.event(f"{replica.name} closing: listener shut, {inflight} in flight finishing")

    async def sampler() -> None:
        while True:
            await asyncio.gather(*(sample_one(r) for r in replicas))
            view.done = len(stream_load.records)
            view.lost = len(stream_load.lost)
            await asyncio.sleep(SAMPLE_SECS)

    async def renderer() -> None:
        while True:
            view.progress = progress()
            view.draw()
            await asyncio.sleep(RENDER_SECS)

    async def wait_in_rotation(replica: cluster.Replica) -> None:
        backend = next(b for b in lb.backends if b.name == replica.name)

        async def in_rotation() -> bool:
            return backend.in_rotation

        await cluster.wait_until(in_rotation, timeout=15, what=f"the balancer to take {replica.name} back")

    background: list[asyncio.Task[None]] = []
    try:
        await asyncio.gather(*(r.start(session) for r in replicas))
        await lb.start()
        await asyncio.gather(*(wait_in_rotation(r) for r in replicas))
        background = [asyncio.create_task(sampler()), asyncio.create_task(renderer())]
        view.event(f"{len(replicas)} replicas ready; balancer probes /readyz every "
                   f"{opts.probe_interval_ms} ms (fall {opts.probe_fall}); {opts.clients} clients streaming")
        stream_load.url = lb.url
        await stream_load.start()

        set_step(0)
        await asyncio.sleep(opts.warmup_secs)
        for i, replica in enumerate(replicas, start=1):
            set_step(i)
            t_sig = now()
            result.marks.append(Mark(t_sig, replica.name, "sigterm"))
            view.event(f"SIGTERM {replica.name} ({view.replicas[replica.name].inflight} in flight)")
            replica.sigterm()
            code = await replica.process.wait_exit(timeout=drain_secs + 60)
            result.exit_codes.append(code)
            result.drain_durations.append(now() - t_sig)
            result.marks.append(Mark(now(), replica.name, "exit"))
            view.event(f"{replica.name} exited {code} after {now() - t_sig:.1f}s; starting it again")
            await replica.start(session)
            await wait_in_rotation(replica)
        set_step(len(steps) - 1)
        await asyncio.sleep(opts.warmup_secs)
    finally:
        await stream_load.stop()
        for task in background:
            task.cancel()
        for task in background:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await lb.stop()
        for replica in replicas:
            replica.process.kill()
        for backend in lb.backends:
            result.balancer_errors.update(backend.errors)
    result.duration = now()
    logged = [Mark(t, r.name, "closing") for r in replicas for t in closing_times(r.process.log_path, wall_started)]
    if logged:  # the router's own drain.closing events are exact; sampling can miss a short closing
        result.marks = [m for m in result.marks if m.kind != "closing"] + logged
    result.records = [dataclasses.replace(r, started=r.started - started, finished=r.finished - started)
                      for r in stream_load.records]
    view.done, view.lost = len(result.records), len(result.lost)
    for rv in view.replicas.values():
        rv.state, rv.inflight = "stopped", 0
    view.progress = (run_index + 1) / runs
    view.step = "done"
    view.event(f"done: {len(result.records)} requests, {len(result.lost)} lost")
    view.end_run()
    return result


def closing_times(log_path: Path, wall_started: float) -> list[float]:
    """Seconds since ``wall_started`` of each ``drain.closing`` event in a router's JSON log."""
    times: list[float] = []
    try:
        lines = log_path.read_text(errors="replace").splitlines()
    except OSError:
        return times
    for line in lines:
        try:
            event = json.loads(line)
            if event.get("event") == "drain.closing":
                times.append(datetime.datetime.fromisoformat(event["timestamp"]).timestamp() - wall_started)
        except (ValueError, KeyError, TypeError, AttributeError):
            continue
    return times


# --------------------------------------------------------------------------------------------------
# The summary.


def _secs(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} s"


def comparison_table(runs: list[RunResult]) -> str:
    """The end-of-demo table, as text. Pure."""
    headers = ["", *[f"{r.label} ({r.drain_secs} s)" for r in runs]]
    rows: list[list[str]] = [
        ["requests", *[str(len(r.records)) for r in runs]],
        ["lost", *[str(len(r.lost)) for r in runs]],
        ["p50 completion", *[_secs(load.percentile([x.duration for x in r.records if not x.outcome.lost], 0.5))
                             for r in runs]],
        ["p99 completion", *[_secs(load.percentile([x.duration for x in r.records if not x.outcome.lost], 0.99))
                             for r in runs]],
        ["drain (SIGTERM to exit)",
         *[_secs(sum(r.drain_durations) / len(r.drain_durations)) if r.drain_durations else "-" for r in runs]],
    ]
    notes: list[str] = []
    for run in runs:
        kinds = Counter(f"{x.status}" if x.outcome.value == "http_error" else x.outcome.value for x in run.lost)
        if kinds:
            why = ", ".join(f"{k} x{n}" for k, n in kinds.most_common())
            if run.balancer_errors:
                why += " (balancer: " + ", ".join(f"{k} x{n}" for k, n in run.balancer_errors.most_common()) + ")"
            notes.append(f"lost in {run.label}: {why}")
    widths = [max(len(row[i]) for row in [headers, *rows]) for i in range(len(headers))]

    def fmt(row: list[str]) -> str:
        return "  ".join([row[0].ljust(widths[0]), *[c.rjust(w) for c, w in zip(row[1:], widths[1:])]]).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([fmt(headers), rule, *[fmt(r) for r in rows], *([""] + notes if notes else [])])


async def run_demo(opts: Options, out: TextIO, *, live: bool, png: Path | None) -> int:
    view = View(out, live=live)
    runs_spec = [("drain on", opts.drain_secs), ("drain off", 0)]
    with tempfile.TemporaryDirectory(prefix="drain-router-demo-") as tmp:
        log_dir = Path(tmp)
        model = cluster.FakeModel(log_dir, chunks=opts.chunks, interval_ms=opts.interval_ms)
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as session:
            try:
                out.write(f"Starting a fake model server ({opts.chunks} chunks every {opts.interval_ms} ms "
                          f"a stream), {opts.replicas} router replicas and a balancer on 127.0.0.1...\n")
                out.flush()
                await model.start(session)
                results = [await run_scenario(label, secs, opts, model, session, view, log_dir, i, len(runs_spec))
                           for i, (label, secs) in enumerate(runs_spec)]
            except (cluster.ProcessFailed, TimeoutError) as exc:
                view.clear()
                out.write(f"\ndemo failed: {exc}\n")
                return 1
            finally:
                model.process.kill()
    out.write("\n" + comparison_table(results) + "\n\n")
    on, off = results
    out.write(f"With a {opts.drain_secs} s drain, the replicas kept serving while the balancer's probes "
              f"took them out of rotation:\n{len(on.lost)} of {len(on.records)} requests lost. Without it, "
              f"{len(off.lost)} of {len(off.records)} were lost: sent to a replica that had already "
              f"closed its listener.\n")
    if png is not None:
        from router.tools import timeline

        try:
            timeline.plot(results, png)
            out.write(f"\nTimeline written to {png}\n")
        except timeline.PlotUnavailable:
            out.write("\nNo PNG timeline: matplotlib is not installed (pip install 'drain-router[plot]').\n")
    out.flush()
    return 1 if on.lost else 0


@click.command("demo")
@click.option("--replicas", default=2, show_default=True, type=click.IntRange(2, 6), help="Router replicas.")
@click.option("--clients", default=16, show_default=True, type=click.IntRange(1, 500),
              help="Concurrent streaming clients.")
@click.option("--drain-secs", default=2, show_default=True, type=click.IntRange(1, 60),
              help="--shutdown-drain-secs of the first run; the second run uses 0.")
@click.option("--probe-interval-ms", default=500, show_default=True, type=click.IntRange(50, 10_000),
              help="The balancer's /readyz probe period.")
@click.option("--probe-fall", default=2, show_default=True, type=click.IntRange(1, 10),
              help="Failed probes before the balancer takes a replica out of rotation.")
@click.option("--chunks", default=20, show_default=True, type=click.IntRange(1, 10_000),
              help="Chunks per streamed completion.")
@click.option("--interval-ms", default=25, show_default=True, type=click.IntRange(0, 10_000),
              help="Milliseconds between chunks.")
@click.option("--png", "png", default="drain-router-demo.png", show_default=True,
              type=click.Path(dir_okay=False, path_type=Path),
              help="Where to write the timeline (needs the 'plot' extra).")
@click.option("--no-png", is_flag=True, default=False, help="Do not write the timeline.")
@click.option("--live/--plain", default=None,
              help="A redrawn live view, or plain event lines. Default: live on a terminal.")
def command(replicas: int, clients: int, drain_secs: int, probe_interval_ms: int, probe_fall: int, chunks: int,
            interval_ms: int, png: Path, no_png: bool, live: bool | None) -> None:
    """Show a rolling restart with and without the drain, on this machine.

    Starts a fake model server, router replicas and a probe-driven balancer on 127.0.0.1, streams
    completions through it, and restarts the replicas one at a time with SIGTERM: first with
    --shutdown-drain-secs DRAIN_SECS, then with 0. Prints a comparison, writes a PNG timeline.
    Exits 1 if the drained run lost a request.
    """
    if drain_secs * 1000 <= probe_interval_ms * probe_fall:
        click.echo(f"note: a {drain_secs} s drain is not longer than the balancer's removal window "
                   f"({probe_interval_ms} ms x {probe_fall}); expect losses in both runs.", err=True)
    opts = Options(replicas=replicas, clients=clients, drain_secs=drain_secs, probe_interval_ms=probe_interval_ms,
                   probe_fall=probe_fall, chunks=chunks, interval_ms=interval_ms)
    is_live = sys.stdout.isatty() if live is None else live
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        code = runner.run(run_demo(opts, sys.stdout, live=is_live, png=None if no_png else png))
    sys.exit(code)
