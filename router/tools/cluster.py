"""Real processes on this machine: the fake model server and router replicas, for the demo and e2e.

The router is driven only as a user drives it: ``python -m router serve ...`` with flags, and
signals. Each process runs in its own session (process group) with its output in a log file, so
:meth:`Process.kill` can always take the whole group down, whatever happened to the test or demo.
Waiting is polling with an explicit deadline, never a bare sleep.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp

LOOPBACK = "127.0.0.1"
POLL_SECS = 0.02


class ProcessFailed(RuntimeError):
    """A process exited or did not become ready in time. The message carries its log's tail."""


_HANDED_OUT: set[int] = set()


def free_port(host: str = LOOPBACK) -> int:
    """A port nothing listens on right now (the kernel's pick for port 0), never one this process
    handed out before: the kernel may pick a just-released port again, and a replica whose admin
    port equals its main port refuses to start."""
    for _ in range(100):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
            port = int(sock.getsockname()[1])
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port
    raise RuntimeError("no fresh free port after 100 tries")


async def wait_until(
    predicate: Callable[[], Awaitable[bool]], *, timeout: float, what: str, interval: float = POLL_SECS
) -> None:
    """Poll ``predicate`` until it is true; ``TimeoutError`` naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        if await predicate():
            return
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout:.1f}s waiting for {what}")
        await asyncio.sleep(interval)


async def get_json(session: aiohttp.ClientSession, url: str, *, timeout: float = 2.0) -> tuple[int, Any]:
    """GET ``url``; ``(status, json or None)``. Raises aiohttp/OS errors for no answer."""
    async with session.get(url, timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
        try:
            return resp.status, await resp.json(content_type=None)
        except ValueError:
            return resp.status, None


@dataclasses.dataclass(slots=True)
class Process:
    """One child process in its own process group, its output in ``log_path``."""

    name: str
    argv: list[str]
    log_path: Path
    popen: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        if self.alive:
            raise RuntimeError(f"{self.name} is already running")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            log.write(f"--- start {' '.join(self.argv)}\n".encode())
            log.flush()
            self.popen = subprocess.Popen(
                self.argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )

    @property
    def pid(self) -> int | None:
        return None if self.popen is None else self.popen.pid

    @property
    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    @property
    def returncode(self) -> int | None:
        return None if self.popen is None else self.popen.poll()

    def signal(self, sig: int) -> None:
        """Send ``sig`` to the process itself (not its group), as the kubelet's runtime does."""
        if self.popen is None:
            raise RuntimeError(f"{self.name} was never started")
        self.popen.send_signal(sig)

    async def wait_exit(self, timeout: float) -> int:
        """Wait for the process to exit; its return code. ``TimeoutError`` if it did not."""
        if self.popen is None:
            raise RuntimeError(f"{self.name} was never started")
        popen = self.popen

        async def exited() -> bool:
            return popen.poll() is not None

        await wait_until(exited, timeout=timeout, what=f"{self.name} to exit")
        rc = popen.poll()
        assert rc is not None
        return rc

    def kill(self) -> None:
        """SIGKILL the whole process group and reap it. Safe to call any time, any number of times."""
        if self.popen is None or self.popen.poll() is not None:
            return  # never started, or already exited and reaped (its pid may belong to another now)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=5)

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def failed(self, why: str) -> ProcessFailed:
        return ProcessFailed(f"{self.name}: {why}; return code {self.returncode}; log tail:\n{self.log_tail()}")


def python_m_router(*args: str) -> list[str]:
    return [sys.executable, "-m", "router", *args]


@dataclasses.dataclass(slots=True)
class FakeModel:
    """``drain-router fake-model`` on a loopback port."""

    log_dir: Path
    port: int = dataclasses.field(default_factory=free_port)
    chunks: int = 10
    interval_ms: int = 30
    exit_on_sigterm: bool = False
    name: str = "fake-model"
    process: Process = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        argv = python_m_router(
            "fake-model",
            "--host",
            LOOPBACK,
            "--port",
            str(self.port),
            "--chunks",
            str(self.chunks),
            "--interval-ms",
            str(self.interval_ms),
        )
        if self.exit_on_sigterm:
            argv.append("--exit-on-sigterm")
        self.process = Process(self.name, argv, self.log_dir / f"{self.name}.log")

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    async def start(self, session: aiohttp.ClientSession, timeout: float = 15.0) -> None:
        self.process.start()
        await _wait_http_ok(session, self.process, f"{self.url}/health", timeout)

    async def stats(self, session: aiohttp.ClientSession) -> dict[str, int]:
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
    port: int = dataclasses.field(default_factory=free_port)
    admin_port: int = dataclasses.field(default_factory=free_port)
    extra_args: tuple[str, ...] = ()
    process: Process = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        argv = python_m_router(
            "serve",
            "--upstream",
            self.upstream,
            "--host",
            LOOPBACK,
            "--port",
            str(self.port),
            "--admin-host",
            LOOPBACK,
            "--admin-port",
            str(self.admin_port),
            "--shutdown-drain-secs",
            str(self.shutdown_drain_secs),
            "--upstream-health-interval-secs",
            "1",
        )
        if self.termination_grace_secs is not None:
            argv += ["--termination-grace-secs", str(self.termination_grace_secs)]
        if self.upstream_health_path:
            argv += ["--upstream-health-path", self.upstream_health_path]
        argv += list(self.extra_args)
        self.process = Process(self.name, argv, self.log_dir / f"{self.name}.log")

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    @property
    def admin_url(self) -> str:
        return f"http://{LOOPBACK}:{self.admin_port}"

    async def start(self, session: aiohttp.ClientSession, timeout: float = 20.0) -> None:
        """Start the router and wait until its /readyz answers 200."""
        self.process.start()
        await _wait_http_ok(session, self.process, f"{self.admin_url}/readyz", timeout)

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


def parse_metrics(text: str) -> Scrape:
    """The parts of a router's Prometheus exposition the e2e reconciles. Pure."""
    from prometheus_client.parser import text_string_to_metric_families

    outcomes: dict[str, int] = {}
    inflight = 0
    state: str | None = None
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "drain_router_requests_total":
                outcome = sample.labels["outcome"]
                outcomes[outcome] = outcomes.get(outcome, 0) + int(sample.value)
            elif sample.name == "drain_router_inflight_requests":
                inflight = int(sample.value)
            elif sample.name == "drain_router_state" and sample.value == 1:
                state = sample.labels["state"]
    return Scrape(outcomes=outcomes, inflight=inflight, state=state)


async def _wait_http_ok(session: aiohttp.ClientSession, process: Process, url: str, timeout: float) -> None:
    async def ok() -> bool:
        if not process.alive:
            raise process.failed(f"exited before {url} answered 200")
        try:
            status, _ = await get_json(session, url, timeout=1.0)
        except (TimeoutError, aiohttp.ClientError, OSError):
            return False
        return status == 200

    try:
        await wait_until(ok, timeout=timeout, what=f"{url} to answer 200")
    except TimeoutError as exc:
        raise process.failed(str(exc)) from None
