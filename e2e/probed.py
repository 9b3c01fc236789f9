"""What HAProxy and Envoy have in common in the e2e suite: a backend server, and a balancer process
that is up once its status answers and can be polled for a server's status.

A balancer may also have a gRPC side (``grpc_servers``): a listener speaking h2c to clients on
``grpc_port`` and a backend of the routers' gRPC ports over h2c. Its servers carry the routers'
names; their statuses are keyed :func:`grpc_key` (``"router-0 (gRPC)"``), and :meth:`wait_status`
of a name waits for that router in every backend it is in."""

from __future__ import annotations

import dataclasses

from drain_router_dev.process import LOOPBACK, Process, wait_until

CHECK_PATH = "/readyz"
"""What the balancers health-check: a router's readiness. A model server straight behind a
balancer (the harness's own proof) is checked on its ``/health`` instead."""


@dataclasses.dataclass(frozen=True, slots=True)
class Server:
    name: str
    port: int
    check_port: int | None = None
    """Where the health check goes when it is not ``port`` (an engine pod's readiness stand-in,
    :class:`drain_router_dev.pods.PodReadiness`, or a router's admin port behind its gRPC port);
    HAProxy only."""


def grpc_key(name: str) -> str:
    """The status key of server ``name`` in a balancer's gRPC backend."""
    return f"{name} (gRPC)"


class ProbedBalancer:
    """Mixin for a balancer dataclass with ``port``, ``grpc_port``, ``servers``, ``grpc_servers``,
    ``process``, ``START_ERRORS`` and an async ``server_status() -> {status key: status}`` (a server's
    name in the HTTP backend, :func:`grpc_key` of it in the gRPC one)."""

    __slots__ = ()
    NAME = "balancer"
    #: What ``server_status()`` raises while the balancer is still starting.
    START_ERRORS: tuple[type[BaseException], ...] = (OSError,)

    port: int
    grpc_port: int
    servers: list[Server]
    grpc_servers: list[Server]
    process: Process

    async def server_status(self) -> dict[str, str]:
        raise NotImplementedError

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    @property
    def grpc_target(self) -> str:
        """``127.0.0.1:GRPC_PORT``: the gRPC listener, as a grpcio channel's target."""
        if not self.grpc_servers:
            raise ValueError(f"this {self.NAME} has no gRPC backend (grpc_servers)")
        return f"{LOOPBACK}:{self.grpc_port}"

    def status_keys(self, name: str) -> list[str]:
        """Where server ``name`` is: its status keys in the HTTP and gRPC backends (just ``name`` if
        it is in neither, so a wait for it names it when it times out)."""
        keys = [name] if any(s.name == name for s in self.servers) else []
        keys += [grpc_key(name)] if any(s.name == name for s in self.grpc_servers) else []
        return keys or [name]

    async def start(self, timeout: float = 20.0) -> None:
        self.process.start()

        async def up() -> bool:
            if not self.process.alive:
                raise self.process.failed("exited at startup")
            try:
                await self.server_status()
            except self.START_ERRORS:
                return False
            return True

        await wait_until(up, timeout=timeout, what=f"{self.NAME}'s status to answer")

    async def wait_status(self, name: str, want: str, timeout: float = 10.0) -> None:
        """Poll until the balancer reports server ``name`` as ``want`` (``UP`` or ``DOWN``; HAProxy
        may add a count, as in ``UP 1/2``) in every backend it is in; a timeout names every
        server's status last read."""
        keys = self.status_keys(name)
        await wait_until(
            self.server_status,
            timeout,
            f"{self.NAME} to see {name} {want}",
            until=lambda status: all(status.get(key, "").startswith(want) for key in keys),
        )
