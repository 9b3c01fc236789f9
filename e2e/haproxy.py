"""A real HAProxy in front of router replicas: config rendering, process, and its view of the servers.

The config is the one an operator would write for a probe-driven balancer in front of draining
replicas: health checks on each replica's ``/readyz`` with a short ``inter`` and ``fall``, pooled
keep-alive server connections shared between clients (``http-reuse always``), and ``retries 0``, so a
request sent to a replica that is gone is a visible failure, not silently retried elsewhere.
WebSocket upgrades pass through (http mode does that by itself) with a ``timeout tunnel`` for the
sessions that follow.

With ``grpc_servers``, a second frontend speaks h2c to gRPC clients (``proto h2`` on the bind: HTTP/2
with prior knowledge, as gRPC sends it) and a second backend sends each stream to a router's gRPC
port over h2c (``proto h2`` on the servers), pooling the connections the same way. HAProxy has no
gRPC health check: each server is checked as the HTTP ones are, ``GET /readyz`` (HTTP/1.1,
``check-proto h1``) on the router's admin port (``port``), which says 503 from SIGTERM just as the
router's gRPC health says NOT_SERVING.
"""

from __future__ import annotations

import asyncio
import csv
import dataclasses
import io
import shutil
from pathlib import Path

from drain_router_dev.process import LOOPBACK, Process, free_port
from e2e import probed
from e2e.probed import Server

BACKEND = "replicas"
GRPC_BACKEND = "grpc_replicas"


def render_config(
    *,
    port: int,
    servers: list[Server],
    stats_socket: Path,
    inter_ms: int = 200,
    fall: int = 1,
    rise: int = 1,
    check_path: str = probed.CHECK_PATH,
    grpc_port: int | None = None,
    grpc_servers: list[Server] | None = None,
) -> str:
    """HAProxy configuration text. Pure. ``grpc_servers`` (a router's gRPC port, its admin port as
    ``check_port``) adds the gRPC frontend on ``grpc_port`` and its backend."""
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
    lines += _server_lines(servers)
    if grpc_servers:
        if grpc_port is None:
            raise ValueError("grpc_servers need a grpc_port to listen on")
        lines += [
            "",
            "frontend grpc_clients",
            # gRPC clients speak HTTP/2 with prior knowledge (h2c): no TLS, no ALPN, no upgrade.
            f"    bind {LOOPBACK}:{grpc_port} proto h2",
            f"    default_backend {GRPC_BACKEND}",
            "",
            f"backend {GRPC_BACKEND}",
            "    balance roundrobin",
            f"    option httpchk GET {check_path}",
            "    http-check expect status 200",
            "    http-reuse always",
            f"    default-server check inter {inter_ms}ms fall {fall} rise {rise}",
        ]
        # Streams go over h2c; the checks stay HTTP/1.1 (else they would use the servers' h2). On each
        # server line: HAProxy 2.6 takes `check-proto` from `default-server` but does not apply it.
        lines += _server_lines(grpc_servers, " proto h2 check-proto h1")
    return "\n".join(lines) + "\n"


def _server_lines(servers: list[Server], options: str = "") -> list[str]:
    return [
        f"    server {s.name} {LOOPBACK}:{s.port}" + (f" port {s.check_port}" if s.check_port else "") + options
        for s in servers
    ]


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
    grpc_servers: list[Server] = dataclasses.field(default_factory=list)
    port: int = dataclasses.field(default_factory=free_port)
    grpc_port: int = dataclasses.field(default_factory=free_port)
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
                grpc_port=self.grpc_port,
                grpc_servers=self.grpc_servers,
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
        """``{server name: "UP" | "DOWN" | ...}`` for the backend (and ``{grpc_key(name): ...}`` for the
        gRPC one), from ``show stat``."""
        text = await self.command("show stat")
        rows = csv.DictReader(io.StringIO(text.lstrip("# ")))
        keys = {BACKEND: lambda name: name, GRPC_BACKEND: probed.grpc_key}
        return {
            keys[row["pxname"]](row["svname"]): row["status"]
            for row in rows
            if row.get("pxname") in keys and row.get("svname") not in ("BACKEND", "FRONTEND")
        }
