"""The gRPC listener (``--grpc-port``): accepts h2c connections, follows the drain.

Serving and draining: streams are accepted and relayed. At SIGTERM every health Watch gets
NOT_SERVING at once. At closing the listener stops accepting and every client connection gets the
graceful GOAWAY sequence; streams in flight run on. At the deadline the calls still open end with
``grpc-status: 14`` (through the in-flight count's abort, like HTTP requests). Every connection
ends with a lingering close, and the process's exit waits for them (at most
:data:`~drain_router.lingering.EXIT_LINGER_SECS`), so a client still sending reads the last calls'
trailers, not a reset.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sized

from drain_router import logs
from drain_router.config import Upstream
from drain_router.decisions import capacity, drain
from drain_router.grpc.answered import LocalHealth
from drain_router.grpc.call import Call
from drain_router.grpc.connection import Flusher
from drain_router.grpc.inbound import Inbound, Sites
from drain_router.grpc.pool import GrpcPool
from drain_router.h2 import frames
from drain_router.h2 import rules as r
from drain_router.metrics import Metrics
from drain_router.state import InFlight, RouterState

log = logs.get("drain_router.grpc")


class GrpcListener:
    def __init__(
        self,
        state: RouterState,
        upstream: Upstream | None,
        connect_timeout: float,
        *,
        connection_limit: int,
        sites: Sites | None = None,
        counted: Sized | None = None,
    ) -> None:
        self.state = state
        self.connection_limit = connection_limit
        """Client connections at once (its share of the descriptors); one past it gets GOAWAY."""
        self.inflight: InFlight = state.inflight
        self.gate = state.gate
        self.answers = capacity.GRPC_ANSWERS
        self.sites = sites
        """Where each call goes when calls name it (the activator's services); None: :attr:`pool`."""
        self.metrics: Metrics = state.metrics
        self.access_log = state.config.log.access_log
        self.tracer = state.tracer
        self.loop = asyncio.get_running_loop()
        self.flusher = Flusher()
        """Every connection of this listener with output waiting, written once per turn of the loop."""
        proxy = state.config.proxy
        self.preface_timeout = float(proxy.client_header_timeout_secs)
        """A client connection's preface must arrive within this (the client header timeout)."""
        self.idle_timeout = float(proxy.client_keepalive_timeout_secs)
        """A client connection with no stream for this long gets GOAWAY (the keep-alive timeout)."""
        self.connect_timeout = connect_timeout
        self.pool: GrpcPool | None = (
            None if upstream is None else GrpcPool(upstream, connect_timeout, self.upstream_limit, self.flusher)
        )
        self.max_streams = r.MAX_CONCURRENT_STREAMS
        """Advertised to every client connection: never above the model server's own limit."""
        self.conns: set[Inbound] = set()
        self.closing = False
        """:meth:`close` ran."""
        self.none_open = asyncio.Event()
        """Set whenever the last client connection is gone (what the exit waits for)."""
        self.counted: Sized = self.conns if counted is None else counted
        """The connections ``connection_limit`` bounds: this listener's, or those of every listener
        sharing the budget (the activator's, one listener per port)."""
        self.watches: set[Call] = set()
        self.local_health: set[LocalHealth] = set()
        self.server: asyncio.Server | None = None
        self.warming: asyncio.Future[None] | None = None

    @property
    def serving(self) -> bool:
        return self.state.phase == drain.Phase.SERVING

    async def warm(self, interrupt: asyncio.Event) -> None:
        """Before binding: connect to the model server to learn its stream limit, so the first clients
        are told the right one. At most the connect timeout (a model server that is down or starting
        is only logged), and cut short by ``interrupt`` (a SIGTERM during startup)."""
        assert self.pool is not None  # (the router's listener: one model server)
        self.warming = asyncio.ensure_future(self.pool.warm())
        stop = asyncio.ensure_future(interrupt.wait())
        await asyncio.wait((self.warming, stop), return_when=asyncio.FIRST_COMPLETED)
        stop.cancel()

    async def bind(self, host: str, port: int) -> int:
        """Start accepting; returns the bound port."""
        self.server = await self.loop.create_server(lambda: Inbound(self), host, port, reuse_address=True)
        return int(self.server.sockets[0].getsockname()[1])

    def opened(self, conn: Inbound) -> None:
        self.conns.add(conn)

    def closed(self, conn: Inbound) -> None:
        self.conns.discard(conn)
        if not self.conns:
            self.none_open.set()

    def upstream_limit(self, limit: int) -> None:
        """The model server's SETTINGS_MAX_CONCURRENT_STREAMS: clients are never allowed more."""
        lowered = min(r.MAX_CONCURRENT_STREAMS, limit)
        if lowered < self.max_streams:
            self.max_streams = lowered
            update = frames.settings({frames.MAX_CONCURRENT_STREAMS: lowered})
            for conn in self.conns:
                conn.core.control(update)
            self.flusher.flush()

    def phase_changed(self, phase: drain.Phase) -> None:
        """Health Watches follow the router's state at once."""
        if phase == drain.Phase.SERVING:
            for local in list(self.local_health):
                if local.watch:
                    local.serving_now()
        elif phase in (drain.Phase.DRAINING, drain.Phase.CLOSING):
            for call in list(self.watches):
                call.not_serving()
        self.flusher.flush()

    def stop_accepting(self) -> None:
        """Closing: no new connections; every connection gets the graceful GOAWAY sequence."""
        if self.server is not None:
            self.server.close()
        for conn in list(self.conns):
            conn.shutdown()
        self.flusher.flush()

    def close(self) -> None:
        """The process exits: a connection still waiting for its shutdown PING gets the final GOAWAY
        (its last stream id) before it is closed, so the client knows which streams were processed.
        Once: closing again does nothing."""
        if self.closing:
            return
        self.closing = True
        if self.server is not None:
            self.server.close()
        for conn in list(self.conns):
            conn.final_goaway()
            conn.close()
        self.flusher.flush()
        if self.warming is not None:
            self.warming.cancel()
        if self.pool is not None:
            self.pool.close()

    async def wait_closed(self, timeout: float) -> None:
        """After :meth:`close`: wait until the lingering closes end (each client's FIN), at most
        ``timeout``; the connections left then are cut."""
        if self.conns:
            self.none_open.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.none_open.wait(), timeout)
        for conn in list(self.conns):
            conn.cut()
