"""Real processes on this machine: the fake model server and router replicas, for the demo and e2e.

The router is driven only as a user drives it: ``python -m drain_router serve ...`` with flags, and
signals. Starting, waiting for and stopping the processes is :mod:`drain_router_dev.process`.
"""

from __future__ import annotations

import dataclasses
import signal
import sys
from pathlib import Path
from typing import Any

import aiohttp

from drain_router_dev import process as process_


async def get_json(session: aiohttp.ClientSession, url: str, *, timeout: float = 2.0) -> tuple[int, Any]:
    """GET ``url``; ``(status, json or None)``. Raises aiohttp/OS errors for no answer."""
    async with session.get(url, timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
        try:
            return resp.status, await resp.json(content_type=None)
        except ValueError:
            return resp.status, None


def loopback_url(port: int) -> str:
    """The base URL of a server on this machine's loopback ``port``."""
    return f"http://{process_.LOOPBACK}:{port}"


DEV_COMMANDS = frozenset({"fake-model", "demo"})
"""The commands of ``drain-router-dev``; every other one is the product's ``drain-router``."""


def command_process(name: str, log_dir: Path, command: str, port: int, *args: str) -> process_.Process:
    """``python -m drain_router COMMAND`` (``drain_router_dev`` for a dev tool) listening on loopback
    ``port``, with ``args``; its output goes to ``LOG_DIR/NAME.log``. Not started."""
    module = "drain_router_dev" if command in DEV_COMMANDS else "drain_router"
    argv = [sys.executable, "-m", module, command, "--host", process_.LOOPBACK, "--port", str(port), *args]
    return process_.Process(name, argv, log_dir / f"{name}.log")


@dataclasses.dataclass(slots=True)
class FakeModel:
    """``drain-router-dev fake-model`` on a loopback port; with ``grpc``, its gRPC endpoint too."""

    log_dir: Path
    port: int = dataclasses.field(default_factory=process_.free_port)
    chunks: int = 10
    interval_ms: int = 30
    exit_on_sigterm: bool = False
    shutdown_timeout_secs: float | None = None
    """The model server's ``--shutdown-timeout-secs`` (its own default when ``None``)."""
    name: str = "fake-model"
    grpc: bool = False
    """Serve gRPC too (``--grpc-port``): vLLM's engine service and ``grpc.health.v1``."""
    grpc_port: int | None = None
    """The gRPC port, the same across restarts: a free one is picked when ``grpc`` and none is given."""
    batch_size: int = 0
    """``--batch-size``: the engine's capacity as continuous batching (0: unlimited)."""
    first_token_ms: int = 0
    """``--first-token-ms``: the prefill before a stream's first token."""
    process: process_.Process = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        args = ["--chunks", str(self.chunks), "--interval-ms", str(self.interval_ms)]
        if self.batch_size:
            args += ["--batch-size", str(self.batch_size)]
        if self.first_token_ms:
            args += ["--first-token-ms", str(self.first_token_ms)]
        if self.exit_on_sigterm:
            args.append("--exit-on-sigterm")
        if self.shutdown_timeout_secs is not None:
            args += ["--shutdown-timeout-secs", str(self.shutdown_timeout_secs)]
        if self.grpc and self.grpc_port is None:
            self.grpc_port = process_.free_port()
        if self.grpc_port is not None:
            args += ["--grpc-port", str(self.grpc_port)]
        self.process = command_process(self.name, self.log_dir, "fake-model", self.port, *args)

    @property
    def url(self) -> str:
        return loopback_url(self.port)

    @property
    def grpc_url(self) -> str:
        """``http://127.0.0.1:GRPC_PORT``: what a router's ``--grpc-upstream`` names."""
        if self.grpc_port is None:
            raise ValueError(f"{self.name} serves no gRPC (FakeModel(grpc=True) does)")
        return loopback_url(self.grpc_port)

    async def start(self, session: aiohttp.ClientSession, timeout: float = 15.0) -> None:
        """Start the model server and wait until its /health answers 200 and, with gRPC, its
        ``grpc.health.v1`` Check answers SERVING."""
        self.process.start()
        await wait_http_ok(session, self.process, f"{self.url}/health", timeout)
        if self.grpc_port is not None:
            await _wait_grpc_serving(self.process, self.grpc_port, timeout)

    async def stats(self, session: aiohttp.ClientSession) -> dict[str, Any]:
        """``/stats``: the streams' counters, the sessions' and, under ``grpc``, the gRPC calls'."""
        _, body = await get_json(session, f"{self.url}/stats")
        return dict(body)


@dataclasses.dataclass(slots=True)
class Replica:
    """One ``drain-router serve`` process in front of ``upstream``, on fixed loopback ports.

    The ports stay the same across restarts, like a pod's address behind a load balancer's server line.
    """

    name: str
    upstream: str
    log_dir: Path
    shutdown_drain_secs: int = 1
    termination_grace_secs: int | None = None
    upstream_health_path: str | None = "/health"
    port: int = dataclasses.field(default_factory=process_.free_port)
    admin_port: int = dataclasses.field(default_factory=process_.free_port)
    extra_args: tuple[str, ...] = ()
    grpc_upstream: str | None = None
    """The model server's gRPC endpoint (``--grpc-upstream``, e.g. :attr:`FakeModel.grpc_url`): the
    router opens its gRPC listener on :attr:`grpc_port` and relays to it."""
    grpc_port: int | None = None
    """The router's gRPC port (``--grpc-port``), fixed like the others: a free one is picked when
    ``grpc_upstream`` is given and this is not."""
    process: process_.Process = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        args = [
            *("--upstream", self.upstream),
            *("--admin-host", process_.LOOPBACK, "--admin-port", str(self.admin_port)),
            *("--shutdown-drain-secs", str(self.shutdown_drain_secs)),
            *("--upstream-health-interval-secs", "1"),
            # A crashed local model server refuses connections at once: notice it at the first failed
            # poll, so the demo's and e2e's fault windows stay about a second long.
            *("--upstream-health-timeout-secs", "1", "--upstream-health-failure-threshold", "1"),
        ]
        if self.termination_grace_secs is not None:
            args += ["--termination-grace-secs", str(self.termination_grace_secs)]
        if self.upstream_health_path:
            args += ["--upstream-health-path", self.upstream_health_path]
        if self.grpc_upstream is not None:
            if self.grpc_port is None:
                self.grpc_port = process_.free_port()
            args += ["--grpc-port", str(self.grpc_port), "--grpc-upstream", self.grpc_upstream]
        elif self.grpc_port is not None:
            raise ValueError(f"{self.name}: grpc_port without grpc_upstream (the router takes both or neither)")
        self.process = command_process(self.name, self.log_dir, "serve", self.port, *args, *self.extra_args)

    @property
    def url(self) -> str:
        return loopback_url(self.port)

    @property
    def admin_url(self) -> str:
        return loopback_url(self.admin_port)

    @property
    def grpc_target(self) -> str:
        """``127.0.0.1:GRPC_PORT``: the router's gRPC listener, as a grpcio channel's target."""
        if self.grpc_port is None:
            raise ValueError(f"{self.name} has no gRPC listener (Replica(grpc_upstream=...) opens one)")
        return f"{process_.LOOPBACK}:{self.grpc_port}"

    async def start(self, session: aiohttp.ClientSession, timeout: float = 20.0) -> None:
        """Start the router and wait until its /readyz answers 200 (its gRPC listener, if any, is
        bound before: the router binds every listener, then turns ready)."""
        self.process.start()
        await wait_http_ok(session, self.process, f"{self.admin_url}/readyz", timeout)

    def sigterm(self) -> None:
        self.process.signal(signal.SIGTERM)

    async def inflight(self, session: aiohttp.ClientSession) -> dict[str, Any]:
        _, body = await get_json(session, f"{self.admin_url}/admin/inflight")
        return dict(body)

    async def readyz(self, session: aiohttp.ClientSession) -> tuple[int, Any]:
        return await get_json(session, f"{self.admin_url}/readyz")

    async def metrics(self, session: aiohttp.ClientSession, *, timeout: float = 2.0) -> Scrape:
        """One ``/metrics`` scrape (a consistent snapshot: the router renders it in one go)."""
        async with session.get(f"{self.admin_url}/metrics", timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
            resp.raise_for_status()
            return parse_metrics(await resp.text())


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Scrape:
    """What a router's ``/metrics`` said: requests by outcome, in flight, and its state."""

    outcomes: dict[str, int]
    """``drain_router_requests_total`` summed over ``code``, by ``outcome``."""
    inflight: int
    state: str | None
    sessions: int = 0
    """``drain_router_websocket_sessions``: open WebSocket tunnels (each also one of ``inflight``)."""
    grpc_outcomes: dict[str, int] = dataclasses.field(default_factory=dict)
    """``drain_router_grpc_requests_total`` summed over ``grpc_status``, by ``outcome``: the gRPC
    listener's streams (each also one of ``inflight`` while it runs)."""

    @property
    def every_outcome(self) -> dict[str, int]:
        """``outcomes`` and ``grpc_outcomes`` added up: every request the router proxied, HTTP
        (WebSocket sessions included) or gRPC, by outcome (the two share their outcome names)."""
        return {
            k: self.outcomes.get(k, 0) + self.grpc_outcomes.get(k, 0) for k in {*self.outcomes, *self.grpc_outcomes}
        }


def parse_metrics(text: str) -> Scrape:
    """The parts of a router's Prometheus exposition the e2e reconciles. Pure."""
    from prometheus_client.parser import text_string_to_metric_families

    outcomes: dict[str, int] = {}
    grpc_outcomes: dict[str, int] = {}
    inflight = sessions = 0
    state: str | None = None
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in ("drain_router_requests_total", "drain_router_grpc_requests_total"):
                counts = outcomes if sample.name == "drain_router_requests_total" else grpc_outcomes
                outcome = sample.labels["outcome"]
                counts[outcome] = counts.get(outcome, 0) + int(sample.value)
            elif sample.name == "drain_router_inflight_requests":
                inflight = int(sample.value)
            elif sample.name == "drain_router_websocket_sessions":
                sessions = int(sample.value)
            elif sample.name == "drain_router_state" and sample.value == 1:
                state = sample.labels["state"]
    return Scrape(outcomes=outcomes, inflight=inflight, state=state, sessions=sessions, grpc_outcomes=grpc_outcomes)


async def _wait_grpc_serving(process: process_.Process, port: int, timeout: float) -> None:
    """Until a ``grpc.health.v1`` Check of the server (service ``""``) on loopback ``port`` answers
    SERVING. grpcio is loaded only here: the devtools distribution's dependencies has it."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    target = f"{process_.LOOPBACK}:{port}"
    async with grpc.aio.insecure_channel(target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)

        async def serving() -> bool:
            if not process.alive:
                raise process.failed(f"exited before gRPC health on {target} said SERVING")
            try:
                answer = await stub.Check(health_pb2.HealthCheckRequest(), timeout=1.0)
            except grpc.aio.AioRpcError:
                return False
            return bool(answer.status == health_pb2.HealthCheckResponse.SERVING)

        try:
            await process_.wait_until(serving, timeout=timeout, what=f"gRPC health on {target} to say SERVING")
        except TimeoutError as exc:
            raise process.failed(str(exc)) from None


async def wait_http_ok(session: aiohttp.ClientSession, process: process_.Process, url: str, timeout: float) -> None:
    async def ok() -> bool:
        if not process.alive:
            raise process.failed(f"exited before {url} answered 200")
        try:
            status, _ = await get_json(session, url, timeout=1.0)
        except (TimeoutError, aiohttp.ClientError, OSError):
            return False
        return status == 200

    try:
        await process_.wait_until(ok, timeout=timeout, what=f"{url} to answer 200")
    except TimeoutError as exc:
        raise process.failed(str(exc)) from None
