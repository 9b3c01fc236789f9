"""The traffic listener: accepts client connections, keeps their deadlines, refuses past its limit.

Each accepted connection is a :class:`~drain_router.http1.client.ClientConnection` (parsing with llhttp,
answering probes, proxying through one :class:`~drain_router.http1.exchange.Exchange` per request).

- **Descriptor reserve**: at most ``connection_limit`` client connections. Each proxied request also
  holds an upstream connection, so past the limit a new connection is answered 503 and closed
  (:mod:`drain_router.http1.refusals`), and the admin listener (probes, metrics, preStop) always has
  descriptors left. A liveness probe that cannot connect would get the pod restarted and every held
  stream killed.
- **Deadlines** (header timeout, keep-alive idle timeout) are checked by one sweep over the
  connections every quarter of the shorter timeout (at most a second), not by a timer per request.
- **Departures while not reading**: a connection whose reading is paused (pipelined requests
  waiting, an upload ahead of the model server) would not see its client leave, so the same sweep
  asks the kernel (one ``poll`` for all of them) which peers have hung up, and aborts those: their
  requests leave the in-flight count and the model server sees them cancelled.
"""

from __future__ import annotations

import asyncio
import select
from collections.abc import Sized

from drain_router import logs
from drain_router.decisions import capacity
from drain_router.http1 import answers
from drain_router.http1.client import ClientConnection
from drain_router.http1.exchange import Exchange
from drain_router.http1.reader import Sites
from drain_router.http1.refusals import Refusals
from drain_router.http1.traced import TracedExchange
from drain_router.http1.upstream.pool import UpstreamPool
from drain_router.http1.websocket.sessions import OpenTunnels
from drain_router.state import RouterState

log = logs.get("drain_router.proxy")

#: Refused connections that may linger at once; more are closed as soon as they are answered.
MAX_LINGERING_REFUSED = 16


class TrafficListener:
    """The listening socket, its client connections and their deadlines."""

    exchange_type = Exchange
    traced_exchange_type = TracedExchange

    def __init__(
        self,
        state: RouterState,
        pool: UpstreamPool | None,
        *,
        connection_limit: int,
        sites: Sites | None = None,
        counted: Sized | None = None,
    ) -> None:
        proxy = state.config.proxy
        self.state = state
        self.pool = pool
        self.host_header = b"" if pool is None else pool.host_header
        self.refusal: answers.Error | None = None
        self.sites = sites
        """None: every request goes to this listener's own gate and pool (the router); else each
        request's destination is picked from its head (the activator's services)."""
        self.metrics = state.metrics
        self.inflight = state.inflight
        self.gate = state.gate
        self.exempt_paths = capacity.exempt_paths(
            state.config.admission.exempt_paths, state.config.health.upstream_health_path
        )
        """GETs that neither wait for an admission slot nor take one."""
        self.loop = asyncio.get_running_loop()
        self.max_body = proxy.max_request_body_bytes
        self.access_log = state.config.log.access_log
        self.tracer = state.tracer
        self.header_timeout = float(proxy.client_header_timeout_secs)
        self.keepalive_timeout = float(proxy.client_keepalive_timeout_secs)
        self.connection_limit = connection_limit
        self.clients: set[ClientConnection] = set()
        self.counted: Sized = self.clients if counted is None else counted
        """The connections ``connection_limit`` bounds: this listener's, or those of every listener
        sharing the budget (the activator's, one listener per port)."""
        self.tunnels = OpenTunnels(self.metrics.websocket_sessions)
        """Open WebSocket tunnels (their client connections are in ``clients`` too)."""
        self.refusals = Refusals(
            self.metrics,
            log,
            event="proxy.connection_refused",
            reason="connection_limit",
            answer=answers.error(*answers.AT_LIMIT, close=True, extra=answers.refused(answers.AT_LIMIT[1])),
            max_lingering=MAX_LINGERING_REFUSED,
        )
        self.server: asyncio.AbstractServer | None = None
        self.timeout_log = logs.RateLimited(log, "proxy.header_timeout", level="info")
        self.bad_request_log = logs.RateLimited(log, "proxy.bad_request", level="info")
        self.bad_target_log = logs.RateLimited(log, "proxy.bad_target", level="info")
        self._sweep_every = max(0.05, min(1.0, self.header_timeout / 4, self.keepalive_timeout / 4))
        self._sweeper: asyncio.TimerHandle | None = None

    async def start(self, host: str, port: int) -> int:
        self.server = await self.loop.create_server(self._connection, host, port, backlog=4096)
        self._sweeper = self.loop.call_later(self._sweep_every, self._sweep)
        return int(self.server.sockets[0].getsockname()[1])

    def _connection(self) -> asyncio.Protocol:
        if len(self.counted) >= self.connection_limit:
            return self.refusals.protocol(open_connections=len(self.counted), limit=self.connection_limit)
        return ClientConnection(self)

    def _sweep(self) -> None:
        now = self.loop.time()
        for client in [c for c in self.clients if c.deadline is not None and c.deadline <= now]:
            client.deadline_passed()
        paused = [c for c in self.clients if c.paused_for and c.transport is not None]
        if paused:
            reap_departed(paused)
        self._sweeper = self.loop.call_later(self._sweep_every, self._sweep)

    def stop_accepting(self) -> None:
        """Closing: no new connections; idle keep-alive ones are closed now, busy ones after their response."""
        if self.server is not None:
            self.server.close()
        for client in list(self.clients):
            client.close_when_idle()

    def close(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
        if self.server is not None:
            self.server.close()
        for client in list(self.clients):
            if client.transport is not None:
                client.transport.abort()


_HUNG_UP = select.POLLRDHUP | select.POLLHUP | select.POLLERR


def reap_departed(clients: list[ClientConnection]) -> None:
    """Abort the connections among ``clients`` whose peer has hung up (a FIN or a reset), seen by
    the kernel even while their reading is paused and their unread input is queued."""
    poller = select.poll()
    by_fd: dict[int, ClientConnection] = {}
    for client in clients:
        sock = client.transport.get_extra_info("socket")
        fd = sock.fileno() if sock is not None else -1
        if fd >= 0:
            by_fd[fd] = client
            poller.register(fd, _HUNG_UP)
    for fd, events in poller.poll(0):
        client = by_fd[fd]
        if events & _HUNG_UP and client.transport is not None:
            client.transport.abort()
