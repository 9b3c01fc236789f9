"""What HAProxy and Envoy have in common in the e2e suite: a backend server, and a balancer process
that is up once its status answers and can be polled for a server's status."""

from __future__ import annotations

import dataclasses

from drain_router.tools.process import LOOPBACK, Process, wait_until

CHECK_PATH = "/readyz"
"""What the balancers health-check: a router's readiness. A model server straight behind a
balancer (the harness's own proof) is checked on its ``/health`` instead."""


@dataclasses.dataclass(frozen=True, slots=True)
class Server:
    name: str
    port: int
    check_port: int | None = None
    """Where the health check goes when it is not ``port`` (an engine pod's readiness stand-in,
    :class:`drain_router.tools.pods.PodReadiness`); HAProxy only."""


class ProbedBalancer:
    """Mixin for a balancer dataclass with ``name``, ``port``, ``process``, ``START_ERRORS`` and an
    async ``server_status() -> {server name: status}``."""

    __slots__ = ()
    NAME = "balancer"
    #: What ``server_status()`` raises while the balancer is still starting.
    START_ERRORS: tuple[type[BaseException], ...] = (OSError,)

    port: int
    process: Process

    async def server_status(self) -> dict[str, str]:
        raise NotImplementedError

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

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
        may add a count, as in ``UP 1/2``); a timeout names every server's status last read."""
        await wait_until(
            self.server_status,
            timeout,
            f"{self.NAME} to see {name} {want}",
            until=lambda status: status.get(name, "").startswith(want),
        )
