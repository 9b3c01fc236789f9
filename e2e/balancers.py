"""The two real probe-driven load balancers of the e2e suite behind one small interface.

Both HAProxy (``e2e/haproxy.py``) and Envoy (``e2e/envoy.py``) health-check each replica's ``/readyz``
every ``inter_ms`` (one failure takes it out, one success puts it back), pool keep-alive connections
to the replicas, never retry, and listen on 127.0.0.1 only. A scenario gets one through :func:`make`
and uses ``url``, ``process``, ``start()`` and ``wait_status(name, "UP" | "DOWN")``. Both forward
WebSocket upgrades and relay the tunnels that follow (the realtime sessions of
``e2e/test_realtime_sessions.py``). With ``grpc_servers`` each also has a gRPC side (``grpc_target``):
h2c from clients, h2c to the routers' gRPC ports, each router checked as its balancer checks gRPC
servers best (HAProxy: ``/readyz`` on the admin port; Envoy: ``grpc.health.v1`` on the gRPC port).
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from drain_router_dev.process import Process
from e2e import envoy, haproxy, probed

KINDS = ("haproxy", "envoy")


class Balancer(Protocol):
    process: Process

    @property
    def url(self) -> str: ...

    @property
    def grpc_target(self) -> str: ...

    async def start(self) -> None: ...

    async def server_status(self) -> dict[str, str]: ...

    async def wait_status(self, name: str, want: str, timeout: float = 10.0) -> None: ...


def binary(kind: str) -> str | None:
    if kind == "haproxy":
        return haproxy.binary()
    if kind == "envoy":
        return envoy.binary()
    raise ValueError(f"unknown balancer {kind!r}; one of {KINDS}")


def make(
    kind: str,
    workdir: Path,
    servers: list[tuple[str, int]],
    *,
    inter_ms: int = 200,
    check_path: str = probed.CHECK_PATH,
    grpc_servers: list[tuple[str, int, int]] | None = None,
) -> Balancer:
    """A not yet started balancer of ``kind`` over ``servers`` (name, port), checking ``check_path``;
    with ``grpc_servers`` (name, gRPC port, admin port: routers), its gRPC side too."""
    grpc_servers = grpc_servers or []
    if kind == "haproxy":
        return haproxy.HAProxy(
            workdir,
            [haproxy.Server(n, p) for n, p in servers],
            inter_ms=inter_ms,
            check_path=check_path,
            grpc_servers=[haproxy.Server(n, p, check_port=admin) for n, p, admin in grpc_servers],
        )
    if kind == "envoy":
        return envoy.Envoy(
            workdir,
            [envoy.Server(n, p) for n, p in servers],
            inter_ms=inter_ms,
            check_path=check_path,
            grpc_servers=[envoy.Server(n, p) for n, p, _admin in grpc_servers],
        )
    raise ValueError(f"unknown balancer {kind!r}; one of {KINDS}")
