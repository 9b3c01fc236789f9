"""The pods the demo and the e2e suite restart, as processes on this machine: a router in front of a
model server (:class:`RouterPod`), or an engine alone behind a preStop sleep (:class:`EnginePod`).

The balancer in front learns that a pod is going only from its readiness probe. For a router pod
that is the router's ``/readyz``. For an engine pod it is :class:`PodReadiness`, a stand-in for what
Kubernetes reports: not ready from the moment the pod is deleted (the EndpointSlice marks a
terminating pod not ready; the preStop sleep exists to outlast that propagation), otherwise the
engine's own ``/health``. So both are taken out of rotation by the same probe window.
With ``EnginePod(balancer_sees_deletion=False)`` it is the engine's ``/health`` alone: a balancer
that health-checks pod addresses and never learns of the deletion.

Which pods a run compares, and KServe's windows scaled to the run's, are :mod:`drain_router_dev.recipes`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import signal
import time
from pathlib import Path
from typing import Protocol

import aiohttp
from aiohttp import web

from drain_router.decisions.drain import EXIT_ABORTED, EXIT_CLEAN
from drain_router.runtime.lifecycle import EXIT_STARTUP_FAILED
from drain_router_dev import cluster, runs
from drain_router_dev.process import LOOPBACK, Process, free_port

#: Beyond the engine's own shutdown timeout, how long a pod may take to exit before it is a failure.
EXIT_SLACK_SECS = 10.0


@dataclasses.dataclass(frozen=True, slots=True)
class SleepRecipe:
    """How an engine pod ends: the preStop sleep, then SIGTERM and the engine's own drain."""

    prestop_sleep_secs: float
    shutdown_timeout_secs: float
    """``--shutdown-timeout`` of the engine: the grace minus the sleep, as KServe computes it."""


class Pod(Protocol):
    """One pod behind the balancer: ``url`` takes traffic, ``probe_url`` is its readiness."""

    name: str
    process: Process

    @property
    def url(self) -> str: ...

    @property
    def probe_url(self) -> str: ...

    @property
    def grpc_target(self) -> str | None:
        """Where gRPC calls go (``host:port``, h2c), if the pod takes them."""
        ...

    async def start(self, session: aiohttp.ClientSession) -> None: ...

    async def terminate(self) -> int:
        """From the pod's deletion (t0) to its exit: the exit code."""
        ...

    def exit_meaning(self, code: int) -> str:
        """What ``code`` (from :meth:`terminate`) says, for the live view's line."""
        ...

    async def state(self, session: aiohttp.ClientSession) -> str: ...

    def closing_times(self, wall_started: float) -> list[float]:
        """Seconds since ``wall_started`` at which the pod closed its listener."""
        ...

    async def close(self) -> None: ...


def _signalled(code: int) -> str:
    """A negative code is the signal that ended the process (SIGKILL: the grace ran out)."""
    if code < 0:
        name = signal.Signals(-code).name
        return f"{name}: the grace ran out, what was open was cut" if -code == signal.SIGKILL else name
    return f"exit status {code}"


class RouterPod:
    """A router replica (drain on or off) in front of a shared model server.

    ``kill_after_secs``: the pod's grace, after which the demo SIGKILLs a router still running, as
    the kubelet does (None: wait for it to exit)."""

    def __init__(self, replica: cluster.Replica, *, kill_after_secs: float | None = None) -> None:
        self.replica = replica
        self.name = replica.name
        self.process = replica.process
        self.kill_after_secs = kill_after_secs

    @property
    def url(self) -> str:
        return self.replica.url

    @property
    def probe_url(self) -> str:
        return f"{self.replica.url}/readyz"

    @property
    def grpc_target(self) -> str | None:
        return self.replica.grpc_target if self.replica.grpc_port is not None else None

    async def start(self, session: aiohttp.ClientSession) -> None:
        await self.replica.start(session)

    async def terminate(self) -> int:
        self.replica.sigterm()
        if self.kill_after_secs is None:
            return await self.process.wait_exit(timeout=self.replica.shutdown_drain_secs + 60)
        try:
            return await self.process.wait_exit(timeout=self.kill_after_secs)
        except TimeoutError:
            self.process.kill()  # the grace is over: SIGKILL, what is still open is cut
            return await self.process.wait_exit(timeout=10)

    def exit_meaning(self, code: int) -> str:
        """The router's exit codes, as it documents them."""
        if code == EXIT_CLEAN:
            return "drained: everything in flight finished"
        if code == EXIT_ABORTED:
            return (
                "the in-flight deadline (grace - 2 s) ended what was still open: sessions with Close 1001, streams cut"
            )
        if code == EXIT_STARTUP_FAILED:
            return "startup failed"
        return _signalled(code)

    async def state(self, session: aiohttp.ClientSession) -> str:
        try:
            return str((await self.replica.inflight(session))["state"])
        except (TimeoutError, aiohttp.ClientError, OSError, KeyError, ValueError, TypeError):
            return "exited" if not self.process.alive else "down"

    def closing_times(self, wall_started: float) -> list[float]:
        return runs.closing_times(self.process.log_path, wall_started)

    async def close(self) -> None:
        self.process.kill()


class PodReadiness:
    """What Kubernetes says of an engine pod's readiness, on its own port: 503 once the pod is
    deleted, else the engine's ``/health`` answer (503 when it does not answer)."""

    def __init__(self, health_url: str, *, sees_deletion: bool = True) -> None:
        self.health_url = health_url
        self.sees_deletion = sees_deletion
        """False: a balancer that only probes the engine and never learns of the deletion."""
        self.deleted = False
        self.port = free_port()
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None

    @property
    def url(self) -> str:
        return f"{cluster.loopback_url(self.port)}/readyz"

    async def _readyz(self, request: web.Request) -> web.Response:
        if self.deleted and self.sees_deletion:
            return web.json_response({"status": "terminating"}, status=503)
        status = 503  # closing: no session to ask the engine with
        if self._session is not None:
            try:
                async with self._session.get(self.health_url, timeout=aiohttp.ClientTimeout(total=1)) as resp:
                    status = resp.status
            except (TimeoutError, aiohttp.ClientError, OSError):
                status = 503
        return web.json_response({"status": "ready" if status == 200 else "not_ready"}, status=status)

    async def start(self) -> None:
        if self._runner is not None:
            return
        self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True))
        app = web.Application()
        app.router.add_get("/readyz", self._readyz)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, LOOPBACK, self.port).start()

    async def close(self) -> None:
        runner, session, self._runner, self._session = self._runner, self._session, None, None
        if runner is not None:
            await runner.cleanup()
        if session is not None:
            await session.close()


class EnginePod:
    """An engine with no router (``drain-router-dev fake-model --shutdown-timeout-secs T``, standing in
    for ``vllm serve --shutdown-timeout T``) and a preStop sleep, on fixed loopback ports."""

    def __init__(
        self,
        name: str,
        log_dir: Path,
        recipe: SleepRecipe,
        *,
        chunks: int,
        interval_ms: int,
        balancer_sees_deletion: bool = True,
        grpc: bool = False,
    ) -> None:
        self.name = name
        self.recipe = recipe
        self.engine = cluster.FakeModel(
            log_dir,
            chunks=chunks,
            interval_ms=interval_ms,
            shutdown_timeout_secs=recipe.shutdown_timeout_secs,
            name=name,
            grpc=grpc,
        )
        self.process = self.engine.process
        self.readiness = PodReadiness(f"{self.url}/health", sees_deletion=balancer_sees_deletion)
        self.phase = "starting"
        self.closed_at: list[float] = []
        """Wall-clock times of the engine's SIGTERMs: it closes its listener at once."""

    @property
    def url(self) -> str:
        return self.engine.url

    @property
    def probe_url(self) -> str:
        return self.readiness.url

    @property
    def grpc_target(self) -> str | None:
        """The engine's own gRPC port (with ``grpc``): no router in front, it drains as vLLM does."""
        port = self.engine.grpc_port
        return None if port is None else f"{LOOPBACK}:{port}"

    async def start(self, session: aiohttp.ClientSession, timeout: float = 15.0) -> None:
        self.readiness.deleted = False
        await self.readiness.start()
        await self.engine.start(session, timeout)
        self.phase = "serving"

    async def terminate(self) -> int:
        """The kubelet's order: the pod is deleted (not ready from now), preStop ``sleep`` runs to its
        end, then SIGTERM; the engine drains for up to its shutdown timeout."""
        self.readiness.deleted = True
        self.phase = "preStop sleep"
        await asyncio.sleep(self.recipe.prestop_sleep_secs)  # the recipe's sleep itself, not a wait
        self.phase = "closing"
        self.closed_at.append(time.time())
        self.process.signal(signal.SIGTERM)
        code = await self.process.wait_exit(timeout=self.recipe.shutdown_timeout_secs + EXIT_SLACK_SECS)
        self.phase = "exited"
        return code

    def exit_meaning(self, code: int) -> str:
        return "drained" if code == 0 else _signalled(code)

    async def state(self, session: aiohttp.ClientSession) -> str:
        return self.phase if self.process.alive else "exited"

    def closing_times(self, wall_started: float) -> list[float]:
        return [t - wall_started for t in self.closed_at]

    async def close(self) -> None:
        self.process.kill()
        await self.readiness.close()
