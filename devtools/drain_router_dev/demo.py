"""``drain-router-dev demo``: a rolling restart under each shutdown recipe, on this machine.

The whole story with nothing but the package: clients stream completions (and, with grpcio from
the ``demo`` extra, call vLLM's gRPC ``Generate``) through a small probe-driven balancer
(:mod:`drain_router_dev.balancer`) to two pods, and the pods are restarted one at
a time, once per recipe (:mod:`drain_router_dev.recipes`): drain-router, preStop sleep + engine drain
(KServe's recipe, its windows scaled as the drain is) behind a balancer told of the pod's deletion
and again behind one that probes only the engine, and no drain. A live view shows each pod's
state and in-flight count (with rich, from the ``demo`` extra); at the end a table compares the
runs, and with matplotlib (the same extra) a PNG timeline is written.
"""

from __future__ import annotations

import asyncio
import importlib.util
import sys
import tempfile
from pathlib import Path
from typing import TextIO

import aiohttp
import click
import uvloop

from drain_router_dev import cluster, recipes, runs
from drain_router_dev.options import field_option
from drain_router_dev.process import ProcessFailed
from drain_router_dev.scenario import Options, Scenario
from drain_router_dev.view import View

#: With realtime sessions, the routers declare this much more than their drain window as their
#: termination grace: sessions still open at the in-flight deadline (grace - 2 s) get a Close 1001.
REALTIME_GRACE_EXTRA_SECS = 4


async def run_demo(opts: Options, out: TextIO, *, live: bool, png: Path | None) -> int:
    view = View(out, live=live)
    with tempfile.TemporaryDirectory(prefix="drain-router-demo-") as tmp:
        log_dir = Path(tmp)
        with_grpc = opts.grpc_clients > 0 and importlib.util.find_spec("grpc") is not None
        if opts.grpc_clients and not with_grpc:
            out.write("(no gRPC calls: grpcio is not installed; pip install ./devtools)\n")
        model = cluster.FakeModel(log_dir, chunks=opts.chunks, interval_ms=opts.interval_ms, grpc=with_grpc)
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as session:
            try:
                out.write(
                    f"Streaming completions ({opts.chunks} chunks every {opts.interval_ms} ms) through a "
                    f"balancer to {opts.replicas} pods on 127.0.0.1, restarted under {recipes.how_many()} "
                    f"recipes ({', '.join(recipes.LABELS)})...\n"
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
                    grpc_url=model.grpc_url if with_grpc else None,
                )
                results = [
                    await Scenario(
                        recipe,
                        opts,
                        session,
                        view,
                        log_dir,
                        i,
                        of=len(compared),
                        with_sessions=with_sessions,
                        with_grpc=with_grpc,
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
        from drain_router_dev import timeline

        try:
            timeline.plot(results, png)
            out.write(f"\nTimeline written to {png}\n")
        except timeline.PlotUnavailable:
            out.write("\nNo PNG timeline: matplotlib is not installed (pip install ./devtools).\n")
    out.flush()
    first = results[0]
    return 1 if first.lost or first.grpc_lost or any(not r.end.clean for r in first.sessions) else 0


HELP = f"""Show a rolling restart under {recipes.how_many()} shutdown recipes, on this machine.

Streams completions through a probe-driven balancer to two pods on 127.0.0.1 and restarts them
one at a time: with drain-router (--shutdown-drain-secs set to --drain-secs); with KServe's preStop sleep
and the engine's own drain (vLLM's --shutdown-timeout; 15 s and 45 s scaled by --drain-secs/30),
once with the balancer told of the pod's deletion and once with a balancer that probes only the
engine; and with no drain. Realtime sessions and gRPC calls (vLLM's Generate, through the
balancer's gRPC side) run beside the streams and the table says how each ended. Prints a
comparison and what each run lost, writes a PNG timeline. Exits 1 if drain-router lost a
request or a gRPC call, or cut a session. With --overload it shows admission control instead: the
engine past its capacity, straight and behind a router. With --wake, a model service scaled to zero
woken by its first requests through the activator (exits 1 if one was lost). With --front, streams
cut by a pod's roll, straight to its router and through the front, which continues them on the other
pod (exits 1 if the front lost one or an answer is not the uninterrupted one).
"""


@click.command("demo", help=HELP)
@field_option(Options, "replicas", type=click.IntRange(2, 6), metavar="N", help="Pods per run.")
@field_option(Options, "clients", type=click.IntRange(1, 500), metavar="N", help="Streaming clients.")
@field_option(
    Options,
    "drain_secs",
    type=click.IntRange(1, 60),
    metavar="SECS",
    help="--shutdown-drain-secs of the drain-router run; the sleep recipe's windows scale with it (--drain-secs/30).",
)
@field_option(Options, "probe_interval_ms", type=click.IntRange(50, 10_000), metavar="MS", help="Probe period.")
@field_option(
    Options,
    "probe_fall",
    type=click.IntRange(1, 10),
    metavar="N",
    help="Failed probes before the balancer takes a pod out of rotation.",
)
@field_option(
    Options,
    "realtime_clients",
    type=click.IntRange(0, 500),
    metavar="N",
    help="Realtime (WebSocket) sessions beside the streams, when the router tunnels WebSocket; 0: none.",
)
@field_option(
    Options,
    "grpc_clients",
    type=click.IntRange(0, 500),
    metavar="N",
    help="gRPC clients calling vLLM's Generate through the balancer's gRPC side beside the streams "
    "(needs the 'demo' extra); 0: none.",
)
@field_option(Options, "chunks", type=click.IntRange(1, 10_000), metavar="N", help="Chunks per stream.")
@field_option(Options, "interval_ms", type=click.IntRange(0, 10_000), metavar="MS", help="Milliseconds between chunks.")
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
    "--overload",
    is_flag=True,
    default=False,
    help="Instead of the rolling restart: the engine at 3x its capacity, straight and behind a router's "
    "admission control (--max-concurrent-requests), and a table of what each did (about 30 s).",
)
@click.option(
    "--wake",
    is_flag=True,
    default=False,
    help="Instead of the rolling restart: --clients streams held by a real drain-router activator for a "
    "ModelService scaled to zero (a stand-in Kubernetes API) until a pod it wakes is ready, and a "
    "table of the wake (about 10 s).",
)
@click.option(
    "--front",
    is_flag=True,
    default=False,
    help="Instead of the rolling restart: --clients streams (4 unless given) cut by a pod's roll, straight "
    "to its router and through a real drain-router front, which continues them on the other pod; each "
    "stream shown as it arrives, and a table (about 10 s).",
)
@click.option(
    "--cold-start-secs",
    type=click.FloatRange(0, 120),
    default=3.0,
    show_default=True,
    metavar="SECS",
    help="With --wake: how long the woken pod takes to start (the demo's stand-in for scheduling and model load).",
)
@click.option(
    "--live/--plain", default=None, help="A redrawn live view, or plain event lines. Default: live on a terminal."
)
def command(
    png: Path,
    no_png: bool,
    live: bool | None,
    overload: bool,
    wake: bool,
    front: bool,
    cold_start_secs: float,
    **params: int,
) -> None:
    """The demo (its help: :data:`HELP`)."""
    if front:
        from drain_router_dev import front_demo

        given = click.get_current_context().get_parameter_source("clients") is not click.core.ParameterSource.DEFAULT
        clients = params["clients"] if given else front_demo.CLIENTS
        is_live = sys.stdout.isatty() if live is None else live
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            sys.exit(runner.run(front_demo.run(sys.stdout, clients=clients, live=is_live)))
    if wake:
        from drain_router_dev import wake_demo

        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            sys.exit(runner.run(wake_demo.run(sys.stdout, clients=params["clients"], cold_start_secs=cold_start_secs)))
    if overload:
        from drain_router_dev import overload_demo

        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            sys.exit(runner.run(overload_demo.run(sys.stdout)))
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
