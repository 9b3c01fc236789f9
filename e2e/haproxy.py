"""A real HAProxy in front of router replicas: config rendering, process, and its view of the servers.

The config is the one an operator would write for a probe-driven balancer in front of draining
replicas: health checks on each replica's ``/readyz`` with a short ``inter`` and ``fall``, pooled
keep-alive server connections shared between clients (``http-reuse always``), and ``retries 0``, so a
request sent to a replica that is gone is a visible failure, not silently retried elsewhere.
WebSocket upgrades pass through (http mode does that by itself) with a ``timeout tunnel`` for the
sessions that follow.
"""

from __future__ import annotations

import asyncio
import csv
import dataclasses
import io
import shutil
from pathlib import Path

from drain_router.tools.process import LOOPBACK, Process, free_port
from e2e import probed
from e2e.probed import Server

BACKEND = "replicas"


def render_config(
    *,
    port: int,
    servers: list[Server],
    stats_socket: Path,
    inter_ms: int = 200,
    fall: int = 1,
    rise: int = 1,
    check_path: str = probed.CHECK_PATH,
) -> str:
    """HAProxy configuration text. Pure."""
    lines = [
        "global",
        "    maxconn 4096",
        f"    stats socket {stats_socket} mode 600 level admin",
        "",
        "defaults",
        "    mode http",
        "    timeout connect 2s",
        "    timeout client 30s",
        "    timeout server 30s",
        "    timeout http-keep-alive 10s",
        "    timeout check 1s",
        # WebSocket: HAProxy in http mode passes an Upgrade through and, after the 101, relays the
        # tunnel, idle for up to this long (realtime sessions are long and may be quiet).
        "    timeout tunnel 1h",
        # Without it HAProxy holds small writes back (Nagle-like) and the first SSE bytes wait ~200 ms.
        "    option http-no-delay",
        # A request to a replica that refused is a loss the test must see, not a hidden retry.
        "    retries 0",
        "",
        "frontend clients",
        f"    bind {LOOPBACK}:{port}",
        f"    default_backend {BACKEND}",
        "",
        f"backend {BACKEND}",
        "    balance roundrobin",
        f"    option httpchk GET {check_path}",
        "    http-check expect status 200",
        # Idle server-side keep-alive connections are pooled and shared between client requests:
        # the case where a replica's `Connection: close` while draining matters.
        "    http-reuse always",
        f"    default-server check inter {inter_ms}ms fall {fall} rise {rise}",
    ]
    lines += [
        f"    server {s.name} {LOOPBACK}:{s.port}" + (f" port {s.check_port}" if s.check_port else "") for s in servers
    ]
    return "\n".join(lines) + "\n"


def binary() -> str | None:
    return shutil.which("haproxy")


@dataclasses.dataclass(slots=True)
class HAProxy(probed.ProbedBalancer):
    """One ``haproxy -db`` process with its config and stats socket in ``workdir``."""

    NAME = "haproxy"
    START_ERRORS = (OSError,)

    workdir: Path
    servers: list[Server]
    inter_ms: int = 200
    fall: int = 1
    rise: int = 1
    check_path: str = probed.CHECK_PATH
    port: int = dataclasses.field(default_factory=free_port)
    process: Process = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        config = self.workdir / "haproxy.cfg"
        config.write_text(
            render_config(
                port=self.port,
                servers=self.servers,
                stats_socket=self.stats_socket,
                inter_ms=self.inter_ms,
                fall=self.fall,
                rise=self.rise,
                check_path=self.check_path,
            )
        )
        exe = binary()
        assert exe is not None, "haproxy is not installed"
        self.process = Process("haproxy", [exe, "-db", "-f", str(config)], self.workdir / "haproxy.log")

    @property
    def stats_socket(self) -> Path:
        return self.workdir / "haproxy.sock"

    async def command(self, text: str) -> str:
        reader, writer = await asyncio.open_unix_connection(str(self.stats_socket))
        try:
            writer.write(text.encode() + b"\n")
            await writer.drain()
            return (await reader.read()).decode()
        finally:
            writer.close()
            await writer.wait_closed()

    async def server_status(self) -> dict[str, str]:
        """``{server name: "UP" | "DOWN" | ...}`` for the backend, from ``show stat``."""
        text = await self.command("show stat")
        rows = csv.DictReader(io.StringIO(text.lstrip("# ")))
        return {
            row["svname"]: row["status"]
            for row in rows
            if row.get("pxname") == BACKEND and row.get("svname") not in ("BACKEND", "FRONTEND")
        }
