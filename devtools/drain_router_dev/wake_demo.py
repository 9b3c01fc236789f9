"""``drain-router-dev demo --wake``: a ModelService scaled to zero wakes on its first requests, on this
machine, with the package alone.

The Kubernetes API is the package's stand-in (:mod:`.fake_kube`) holding one ModelService asleep
(phase ScaledToZero) and no pods; a real ``drain-router activator`` process is pointed at it
(``--kube-api``), with the port map (the ConfigMap the controller writes) giving the service one port.
Clients stream completions to that port: the activator holds them and asks for a wake by patching
the ModelService's status. The demo then plays the controller's part, minimally: on that patch it waits
a cold start, starts a model pod (``drain-router-dev fake-model`` behind a real ``drain-router serve``,
on the loopback address as its pod IP) and lists it; it writes nothing else (no route switch, no
endpoints, no status beyond the activator's own patch). The activator forwards the held requests once the pod's
router answers ready. A table says when each step happened and whether any request was lost.
"""

from __future__ import annotations

import asyncio
import dataclasses
import sys
import tempfile
import time
from pathlib import Path
from typing import TextIO

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from drain_router_dev import cluster, fake_kube, load, streams
from drain_router_dev import process as process_

CHUNKS = 10
INTERVAL_MS = 30
POLL_SECS = 0.5
"""The activator's ``--poll-interval-secs`` here (1 s as shipped): how soon it sees the pod ready."""
START_TIMEOUT_SECS = 20.0


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Wake:
    """What the demo saw; every time in seconds from the clients' start."""

    clients: int
    cold_start_secs: float
    held_peak: int
    """``drain_router_activator_held_requests`` at its highest, sampled every 50 ms."""
    wake_asked_at: float | None
    pod_ready_at: float | None
    first_answer_at: float | None
    """The first response head a client got."""
    last_answer_at: float | None
    """The last stream's end."""
    answered: int
    lost: int
    activations: int
    activation_secs: float | None
    """``drain_router_activation_seconds``: from the first request held to forwarding."""


def table(w: Wake) -> str:
    """The rows, one a line (pure)."""

    def at(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f} s"

    rows = [
        ("clients", str(w.clients)),
        ("requests held (peak)", str(w.held_peak)),
        ("wake asked at", at(w.wake_asked_at)),
        (f"pod ready at (cold start {w.cold_start_secs:g} s)", at(w.pod_ready_at)),
        ("first answer at", at(w.first_answer_at)),
        ("last answer at", at(w.last_answer_at)),
        ("answered whole", str(w.answered)),
        ("lost", str(w.lost)),
        ("activations (activator)", str(w.activations)),
        ("activation seconds (activator)", at(w.activation_secs)),
    ]
    width = max(len(label) for label, _ in rows)
    return "\n".join(f"{label.ljust(width)}  {value}" for label, value in rows)


def _samples(text: str) -> dict[str, float]:
    """Every sample of an exposition by name, summed over labels."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[sample.name] = out.get(sample.name, 0.0) + sample.value
    return out


async def _scrape(session: aiohttp.ClientSession, admin_port: int) -> dict[str, float]:
    async with session.get(f"{cluster.loopback_url(admin_port)}/metrics") as resp:
        return _samples(await resp.text())


async def wake(clients: int, cold_start_secs: float, log_dir: Path) -> Wake:
    """One wake: the activator, the clients held, the pod started after the cold start."""
    model = cluster.FakeModel(log_dir, chunks=CHUNKS, interval_ms=INTERVAL_MS)
    pod_router = cluster.Replica("pod-router", model.url, log_dir, shutdown_drain_secs=0)
    port, admin_port = process_.free_port(), process_.free_port()
    async with fake_kube.kube_api() as kube, aiohttp.ClientSession() as session:
        kube.services[(fake_kube.NS, fake_kube.NAME)] = fake_kube.modelservice(port=pod_router.port)
        kube.ports = {str(port): f"{fake_kube.NS}/{fake_kube.NAME}/http"}  # as the controller assigns it
        argv = [sys.executable, "-m", "drain_router", "activator", "--host", process_.LOOPBACK]
        argv += ["--admin-host", process_.LOOPBACK, "--admin-port", str(admin_port), "--kube-api", kube.url]
        argv += ["--ports-configmap", fake_kube.PORTS_CONFIGMAP, "--poll-interval-secs", str(POLL_SECS)]
        activator = process_.Process("activator", [*argv, "--shutdown-drain-secs", "0"], log_dir / "activator.log")
        try:
            activator.start()
            await cluster.wait_http_ok(session, activator, f"{cluster.loopback_url(admin_port)}/readyz", 20.0)
            await _listening(session, admin_port, port)
            return await _run(
                session, kube, cluster.loopback_url(port), admin_port, model, pod_router, clients, cold_start_secs
            )
        finally:
            for proc in (activator, pod_router.process, model.process):
                proc.kill()


async def _listening(session: aiohttp.ClientSession, admin_port: int, port: int) -> None:
    """Until the activator lists ``port`` in ``/admin/ports`` (it opens it at its first read of the map)."""

    async def opened() -> bool:
        _, body = await cluster.get_json(session, f"{cluster.loopback_url(admin_port)}/admin/ports", timeout=1.0)
        return str(port) in ((body or {}).get("ports") or {})

    await process_.wait_until(opened, START_TIMEOUT_SECS, f"the activator to open port {port}")


async def _run(
    session: aiohttp.ClientSession,
    kube: fake_kube.FakeKube,
    url: str,
    admin_port: int,
    model: cluster.FakeModel,
    pod_router: cluster.Replica,
    clients: int,
    cold_start_secs: float,
) -> Wake:
    t0 = time.monotonic()
    marks: dict[str, float] = {}
    heads: list[float] = []
    held_peak = 0

    async def controller() -> None:
        """The controller's part, minimally: a wake asked, a cold start, a pod started and listed."""
        await process_.wait_until(kube.accepted, START_TIMEOUT_SECS + 60, "the wake patch")
        marks["wake"] = time.monotonic() - t0
        await asyncio.sleep(cold_start_secs)  # the pod's cold start (scheduling, image, model load)
        await model.start(session)
        await pod_router.start(session)
        kube.pods = [fake_kube.pod(process_.LOOPBACK, f"{fake_kube.NAME}-0")]
        marks["ready"] = time.monotonic() - t0

    async def client() -> tuple[streams.StreamResult, float]:
        result = await load.stream_completion(
            session,
            url,
            chunks=CHUNKS,
            interval_ms=INTERVAL_MS,
            on_response=lambda _: heads.append(time.monotonic() - t0),
            read_timeout=cold_start_secs + 60,
        )
        return result, time.monotonic() - t0

    async def watch_held() -> None:
        nonlocal held_peak
        while True:
            held = (await _scrape(session, admin_port)).get("drain_router_activator_held_requests", 0.0)
            held_peak = max(held_peak, int(held))
            await asyncio.sleep(0.05)

    waker = asyncio.ensure_future(controller())
    watcher = asyncio.ensure_future(watch_held())
    streaming = [asyncio.ensure_future(client()) for _ in range(clients)]
    try:
        await asyncio.gather(waker, *streaming)  # the controller's failure ends the demo at once
    finally:
        for task in (watcher, waker, *streaming):
            task.cancel()
    results = [task.result() for task in streaming]
    metrics = await _scrape(session, admin_port)
    whole = [end for result, end in results if not streams.classify(result).lost]
    count = metrics.get("drain_router_activation_seconds_count", 0.0)
    return Wake(
        clients=clients,
        cold_start_secs=cold_start_secs,
        held_peak=held_peak,
        wake_asked_at=marks.get("wake"),
        pod_ready_at=marks.get("ready"),
        first_answer_at=min(heads, default=None),
        last_answer_at=max((end for _, end in results), default=None),
        answered=len(whole),
        lost=clients - len(whole),
        activations=int(metrics.get("drain_router_activations_total", 0.0)),
        activation_secs=metrics["drain_router_activation_seconds_sum"] / count if count else None,
    )


async def run(out: TextIO, *, clients: int = 16, cold_start_secs: float = 3.0) -> int:
    """The wake, then its table. Exits 1 if any request was lost."""
    out.write(
        f"A ModelService scaled to zero (the package's stand-in Kubernetes API, no pods); {clients} clients "
        f"stream completions through a real activator, which holds them and asks for a wake. The demo "
        f"plays the controller, minimally: on the wake it waits a {cold_start_secs:g} s cold start, starts a "
        "model pod (fake-model behind drain-router serve) and lists it...\n"
    )
    out.flush()
    with tempfile.TemporaryDirectory(prefix="drain-router-wake-") as tmp:
        result = await wake(clients, cold_start_secs, Path(tmp))
    out.write("\n" + table(result) + "\n")
    out.write(
        "\nEvery request waited in the activator while the pod started and reached it once its router "
        "answered ready; none was refused or lost.\n"
        if not result.lost
        else f"\n{result.lost} request(s) lost.\n"
    )
    out.flush()
    return 1 if result.lost else 0
