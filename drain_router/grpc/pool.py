"""The h2c connections to the model server's gRPC port: a stream goes on the first connection with
room, a new connection is opened when none has any.

The model server's SETTINGS_MAX_CONCURRENT_STREAMS is reported to the listener, which never lets a
client open more streams on one connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Callable
from typing import Protocol

from drain_router import logs
from drain_router.config import Upstream
from drain_router.grpc.connection import Flusher
from drain_router.grpc.outbound import Outbound

log = logs.get("drain_router.grpc")


class Waiter(Protocol):
    """A call waiting for a stream to the model server."""

    def connected(self, conn: Outbound) -> None: ...
    def unreachable(self, reason: str) -> None: ...


class GrpcPool:
    def __init__(
        self, upstream: Upstream, connect_timeout: float, on_limit: Callable[[int], None], flusher: Flusher
    ) -> None:
        self.upstream = upstream
        self.flusher = flusher
        self.connect_timeout = connect_timeout
        self.on_limit = on_limit
        self.conns: list[Outbound] = []
        self.connecting: Outbound | None = None
        self.waiters: list[Waiter] = []
        self._task: asyncio.Task[None] | None = None
        self.closed = False

    def acquire(self, waiter: Waiter) -> None:
        """``waiter.connected(conn)`` with a connection that has room, now or once one is open."""
        for conn in self.conns:
            if conn.usable():
                waiter.connected(conn)
                return
        self.waiters.append(waiter)
        if self._task is None and not self.closed:
            self._task = asyncio.ensure_future(self._connect())

    def cancel(self, waiter: Waiter) -> None:
        with contextlib.suppress(ValueError):
            self.waiters.remove(waiter)

    async def warm(self) -> None:
        """Open a first connection and wait for the model server's SETTINGS (its stream limit), so
        the first clients are told the right limit; failures are only logged (it may be starting)."""
        if self._task is None:
            self._task = asyncio.ensure_future(self._connect())
        with contextlib.suppress(asyncio.CancelledError, TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._task), self.connect_timeout)

    def _forget(self, conn: Outbound) -> None:
        """A connection closed: no stream goes on it again."""
        with contextlib.suppress(ValueError):
            self.conns.remove(conn)

    async def _connect(self) -> None:
        loop = asyncio.get_running_loop()
        conn: Outbound | None = None
        try:
            conn = Outbound(self.flusher, self.conns.append, self._forget, self.on_limit)
            protocol = conn
            if self.upstream.unix_path is not None:
                coro = loop.create_unix_connection(lambda: protocol, self.upstream.unix_path)
            else:
                assert self.upstream.port is not None  # a TCP upstream has one
                coro = loop.create_connection(lambda: protocol, self.upstream.host, self.upstream.port)
            transport, _ = await asyncio.wait_for(coro, self.connect_timeout)
            sock = transport.get_extra_info("socket")
            if sock is not None and sock.family != socket.AF_UNIX:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            await asyncio.wait_for(conn.settled.wait(), self.connect_timeout)
            if conn.core.failed:
                raise ConnectionError("closed before its SETTINGS")
        except (OSError, TimeoutError, ConnectionError) as exc:
            if conn is not None:
                conn.close()
            reason = "timeout" if isinstance(exc, TimeoutError) else type(exc).__name__
            log.warning("grpc.upstream_unreachable", upstream=self.upstream.url, error=reason)
            waiters, self.waiters = self.waiters, []
            self._task = None
            for waiter in waiters:
                waiter.unreachable(reason)
            return
        self._task = None
        self._serve_waiters()

    def _serve_waiters(self) -> None:
        while self.waiters:
            conn = next((c for c in self.conns if c.usable()), None)
            if conn is None:
                if self._task is None and not self.closed:
                    self._task = asyncio.ensure_future(self._connect())
                return
            self.waiters.pop(0).connected(conn)

    def released(self) -> None:
        """A stream ended: a waiter may have room now."""
        if self.waiters:
            self._serve_waiters()

    def close(self) -> None:
        self.closed = True
        if self._task is not None:
            self._task.cancel()
        for conn in list(self.conns):
            conn.close()
        self.conns.clear()
