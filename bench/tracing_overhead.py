"""The ``tracing`` workload of the bench: what ``--tracing`` costs the router.

Three routers in front of the bench upstream, started the same way, measured in the same rounds:
**off** (no ``--tracing``: the router as shipped), **ratio 0** and **ratio 1** (``--tracing`` with
``OTEL_TRACES_SAMPLER=traceidratio`` and ``OTEL_TRACES_SAMPLER_ARG`` 0 or 1, the SDK's
``BatchSpanProcessor`` exporting over OTLP/HTTP). They export to the bench's own collector
(:mod:`bench.otlp_sink`), a process pinned to the load generator's core, so receiving spans is not
charged to the router; each router to its own path, so the sink counts each one's spans.

Each round runs the small GET workload and the paced-stream workload (at
``Plan.tracing_paced_concurrency`` streams) against the three in turn: records
``tracing_small_get`` and ``tracing_sse_paced_<c>`` with the router's CPU per request or chunk (the
bench's own meter: the whole process, the export thread included) and the spans the sink got during
the cell. After the rounds, ``tracing_totals``: per router, the spans the sink got in all (the
routers flush at exit), the export requests and bytes, and the requests served and spans dropped from
the router's ``/metrics``.

The batch processor's queue is raised (:data:`QUEUE_SIZE`) so that no span is dropped under the
closed-loop load: the figure is the cost of exporting every span, not of dropping most of them.
"""

from __future__ import annotations

import importlib.util
import re
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from bench import loadgen, targets
from bench.harness import Group, Harness, Session, Workload
from drain_router_dev import process as process_

#: The routers, in run order: (target name, label, sampling ratio or None for no ``--tracing``).
ARMS: tuple[tuple[str, str, str | None], ...] = (
    ("off", "tracing off (the router as shipped)", None),
    ("ratio0", "--tracing, traceidratio 0", "0"),
    ("ratio1", "--tracing, traceidratio 1", "1"),
)
#: ``OTEL_BSP_MAX_QUEUE_SIZE`` for the traced routers: more spans than a window makes, none dropped.
QUEUE_SIZE = 1_000_000


@dataclass
class TracingRouter(targets.Router):
    """The router, with ``--tracing`` and the ``OTEL_*`` variables of one sampling ratio when
    ``ratio`` is set, exporting to ``endpoint``; the router as shipped when it is None."""

    ratio: str | None = None
    endpoint: str = ""

    def missing(self) -> str | None:
        if self.ratio is not None and importlib.util.find_spec("opentelemetry.sdk") is None:
            return "the OpenTelemetry SDK is not installed (the otel extra)"
        return super().missing()

    def command(self, ctx: targets.Context) -> list[str]:
        return [*super().command(ctx), *(["--tracing"] if self.ratio is not None else [])]

    def env(self) -> dict[str, str]:
        env = super().env()
        if self.ratio is not None:
            env |= {
                "OTEL_TRACES_SAMPLER": "traceidratio",
                "OTEL_TRACES_SAMPLER_ARG": self.ratio,
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": self.endpoint,
                "OTEL_BSP_MAX_QUEUE_SIZE": str(QUEUE_SIZE),
            }
        return env

    def speaks_grpc(self) -> bool:
        return False


def metric_sum(text: str, name: str) -> float | None:
    """The sum of every sample of ``name`` (any labels) in a Prometheus text exposition, an int when
    it is one (a count, kept exact in the results file); None when there is none."""
    found = re.findall(rf"^{re.escape(name)}(?:\{{[^}}]*\}})? ([0-9.eE+-]+|NaN)$", text, flags=re.M)
    values = [float(v) for v in found if v != "NaN"]
    total = float(sum(values))
    return (int(total) if total.is_integer() else total) if values else None


def spans_per_unit(metrics: dict[str, Any], units_key: str) -> float | None:
    """Spans the sink got during a cell per request (or per stream) the cell completed."""
    units = metrics.get(units_key)
    spans = metrics.get("spans_exported")
    if not isinstance(units, (int, float)) or not units or not isinstance(spans, (int, float)):
        return None
    return spans / units


class Tracing(Session):
    """The sink and the three routers of one run."""

    def __init__(self, bench: Harness) -> None:
        super().__init__(bench)
        self.sink: process_.Process | None = None
        self.sink_port = 0
        self.arms: list[TracingRouter] = []
        self.skipped: dict[str, str] = {}

    @property
    def sink_url(self) -> str:
        return f"http://127.0.0.1:{self.sink_port}"

    async def start(self) -> None:
        """The sink and the routers started, then warmed."""
        bench = self.bench
        self.sink_port = process_.free_port()
        self.sink = process_.Process(
            "otlp-sink",
            [sys.executable, "-m", "bench.otlp_sink", "--port", str(self.sink_port)],
            bench.workdir / "otlp-sink.log",
            cwd=Path(__file__).resolve().parent.parent,
            preexec_fn=targets.pin_to(bench.loadgen_cpus),
        )
        self.sink.start()
        targets.wait_ready(self.sink, self.sink_url + "/stats")
        for name, label, ratio in ARMS:
            arm = TracingRouter(name, label, drain_signal=signal.SIGTERM, ratio=ratio)
            arm.endpoint = f"{self.sink_url}/{name}/v1/traces"
            reason = arm.missing()
            if reason is None:
                try:
                    arm.start(bench.ctx, instance="-tracing")
                    self.arms.append(arm)
                except Exception as exc:
                    reason = f"failed to start: {exc}"
                    arm.stop()
            if reason:
                self.skipped[name] = reason
            bench.log(f"tracing arm {name}: {reason or 'ok'}")
        await self.warm()

    async def warm(self) -> None:
        for arm in self.arms:
            await loadgen.requests(arm.url + "/small", 4, min(0.2, self.bench.plan.seconds / 2))

    async def sink_stats(self) -> dict[str, dict[str, int]]:
        async with aiohttp.ClientSession() as http, http.get(self.sink_url + "/stats") as resp:
            stats: dict[str, dict[str, int]] = await resp.json()
            return stats

    def _spans(self, stats: dict[str, dict[str, int]], arm: str) -> int:
        return stats.get(f"/{arm}/v1/traces", {}).get("spans", 0)

    async def _cell(self, round_no: int, workload: str, arm: TracingRouter, units_key: str, run: Any) -> None:
        async def counted() -> dict[str, Any]:
            before = await self.sink_stats()
            metrics: dict[str, Any] = await run()
            after = await self.sink_stats()
            metrics["spans_exported"] = self._spans(after, arm.name) - self._spans(before, arm.name)
            metrics["spans_per_unit"] = spans_per_unit(metrics, units_key)
            return metrics

        work_key = "requests" if workload == "tracing_small_get" else "events_total"
        await self.bench.measure(round_no, workload, arm, work_key, counted)

    async def round(self, round_no: int) -> None:
        bench, plan = self.bench, self.bench.plan
        for name, reason in self.skipped.items():
            bench.records.append(
                {"round": round_no, "workload": "tracing_small_get", "target": name, "metrics": {"skipped": reason}}
            )
        for arm in self.arms:
            await self._cell(round_no, "tracing_small_get", arm, "requests", lambda t=arm: bench.small_get(t))
        conc = plan.tracing_paced_concurrency
        for arm in self.arms:
            await self._cell(
                round_no,
                f"tracing_sse_paced_{conc}",
                arm,
                "streams_done",
                lambda t=arm: bench.sse(t, conc, plan.paced_chunks, plan.paced_interval_ms),
            )

    async def _scrape(self, arm: TracingRouter) -> dict[str, float | None]:
        try:
            async with aiohttp.ClientSession() as http:
                async with http.get(f"http://127.0.0.1:{arm.admin_port}/metrics") as resp:
                    text = await resp.text()
        except (OSError, aiohttp.ClientError):
            return {}
        return {
            "requests_served": metric_sum(text, "drain_router_requests_total"),
            "spans_dropped": metric_sum(text, "drain_router_tracing_spans_dropped_total"),
        }

    async def finish(self) -> None:
        """The totals record of each router, then everything stopped."""
        scraped = {arm.name: await self._scrape(arm) for arm in self.arms}
        self.stop_arms()  # each router flushes its queued spans at exit (bounded: 2 s)
        stats = await self.sink_stats() if self.sink is not None and self.sink.alive else {}
        for arm in self.arms:
            got = stats.get(f"/{arm.name}/v1/traces", {})
            metrics = {
                "spans_exported": got.get("spans", 0),
                "export_requests": got.get("requests", 0),
                "export_bytes": got.get("bytes", 0),
                "export_undecoded": got.get("undecoded", 0),
                **scraped.get(arm.name, {}),
            }
            self.bench.records.append(
                {"round": 0, "workload": "tracing_totals", "target": arm.name, "metrics": metrics}
            )
            self.bench.log(f"  tracing totals {arm.name}: {metrics}")

    def stop_arms(self) -> None:
        for arm in self.arms:
            arm.stop()

    async def stop(self) -> None:
        self.stop_arms()
        if self.sink is not None:
            self.sink.stop(signal.SIGTERM, timeout=5)


#: Its records: ``tracing_small_get``, ``tracing_sse_paced_<c>`` and ``tracing_totals``, on its own
#: routers (the targets named for the run are not started for it).
WORKLOADS = (Workload("tracing", Group("tracing", "tracing"), session=Tracing, suffixed=True, needs_targets=False),)
