"""The upstream pool: keep-alive connections to the model server (:mod:`.connection`), a connection
cap with a queue of requests waiting for one, and the connect with its timeout. A task is made only
to open a new connection."""

from __future__ import annotations

import asyncio
import errno
import socket
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

from drain_router import config, logs
from drain_router.http1 import answers
from drain_router.http1.upstream.connection import UpstreamConnection
from drain_router.metrics import Outcome

log = logs.get("drain_router.proxy")

#: Receive buffer of each upstream socket. The model server is in the same pod (microseconds away),
#: so a small window costs no throughput, and it bounds what one read can pull in while the client
#: on the other side has stopped reading (the kernel would otherwise autotune it to megabytes).
UPSTREAM_RCVBUF_BYTES = 16 * 1024

#: Pooled connections idle longer than this are closed by the router: below the keep-alive timeout
#: of uvicorn (5 s), which vLLM and SGLang serve with, so the model server never closes a connection
#: the router is about to reuse (a POST written to it could not be retried).
UPSTREAM_IDLE_SECS = 4.0

_EMFILE = frozenset({errno.EMFILE, errno.ENFILE})


class Waiter(Protocol):
    """A request waiting for a connection (an exchange)."""

    @property
    def finished(self) -> bool: ...
    @property
    def path(self) -> str: ...

    def attach(self, up: UpstreamConnection, *, reused: bool) -> None: ...
    def fail(self, error: answers.Error, outcome: Outcome) -> None: ...
    def inflight_count(self) -> int: ...


class UpstreamPool:
    """Idle connections (last in, first out), a connection cap (``--upstream-max-connections``, 0 =
    none) with a queue of exchanges waiting for one, and the connect with its timeout."""

    def __init__(self, cfg: config.Config, note_connect: Callable[[bool], None]) -> None:
        proxy = cfg.proxy
        self.upstream = proxy.upstream
        self.host_header = self.upstream.base_url.split("://", 1)[1].encode()
        """``Host`` for a request that came without one (HTTP/1.0)."""
        self.connect_timeout = float(proxy.upstream_connect_timeout_secs)
        self.max_connections = proxy.upstream_max_connections
        self.note_connect = note_connect
        self.loop = asyncio.get_running_loop()
        self.surplus_log = logs.RateLimited(log, "proxy.upstream_surplus", level="warning")
        self.idle: list[UpstreamConnection] = []
        self.open = 0
        self.waiting: deque[Waiter] = deque()
        self.connections: set[UpstreamConnection] = set()
        self._connecting: set[asyncio.Task[None]] = set()
        self._addresses: list[Any] | None = None
        self._sweeper: asyncio.TimerHandle | None = None

    def acquire(self, exchange: Waiter) -> None:
        """Give ``exchange`` a connection now, or once one is free (``exchange.attach``)."""
        idle = self.idle
        while idle:
            up = idle.pop()
            up.idle_at = None
            if up.transport is not None and not up.transport.is_closing():
                exchange.attach(up, reused=True)
                return
        if self.max_connections and self.open >= self.max_connections:
            self.waiting.append(exchange)
            return
        self._spawn_connect(exchange)

    def _spawn_connect(self, exchange: Waiter) -> None:
        self.open += 1
        task = asyncio.ensure_future(self._connect(exchange))
        self._connecting.add(task)
        task.add_done_callback(self._connecting.discard)

    def release(self, up: UpstreamConnection) -> None:
        up.exchange = None
        while self.waiting:
            exchange = self.waiting.popleft()
            if not exchange.finished:
                exchange.attach(up, reused=True)
                return
        up.idle_at = asyncio.get_running_loop().time()
        self.idle.append(up)
        if self._sweeper is None:
            self._sweeper = asyncio.get_running_loop().call_later(UPSTREAM_IDLE_SECS / 2, self._close_stale)

    def done_with(self, up: UpstreamConnection, reusable: bool, completed: bool, paused: bool) -> None:
        """An exchange ended on ``up``: back to the pool when it can carry another request (reading
        resumed if the client's back-pressure had paused it), else closed: gracefully after a whole
        response, aborted otherwise, so the model server sees the request cancelled and stops
        generating."""
        if reusable and up.transport is not None and not up.transport.is_closing():
            if paused:
                up.transport.resume_reading()
            self.release(up)
            return
        up.exchange = None
        if up.transport is not None:
            if completed:
                up.transport.close()
            else:
                up.transport.abort()

    def _close_stale(self) -> None:
        """Close the pooled connections idle for longer than :data:`UPSTREAM_IDLE_SECS` (the oldest
        are first in the list: reuse takes the newest)."""
        self._sweeper = None
        idle = self.idle
        horizon = asyncio.get_running_loop().time() - UPSTREAM_IDLE_SECS
        stale = 0
        while stale < len(idle) and (idle[stale].idle_at or 0.0) <= horizon:
            stale += 1
        for up in idle[:stale]:
            up.idle_at = None
            if up.transport is not None:
                up.transport.close()
        del idle[:stale]
        if idle:
            self._sweeper = asyncio.get_running_loop().call_later(UPSTREAM_IDLE_SECS / 2, self._close_stale)

    def lost(self, up: UpstreamConnection) -> None:
        self.connections.discard(up)
        if up.idle_at is not None:  # no scan of the idle list for the (common) busy connection
            up.idle_at = None
            self.idle.remove(up)
        self._closed_one()

    def _closed_one(self) -> None:
        self.open -= 1
        while self.waiting and (not self.max_connections or self.open < self.max_connections):
            exchange = self.waiting.popleft()
            if not exchange.finished:
                self._spawn_connect(exchange)

    async def open_connection(self) -> UpstreamConnection:
        """A new connection to the model server (TCP with a small receive buffer, or a Unix socket)."""
        loop = asyncio.get_running_loop()
        factory = lambda: UpstreamConnection(self)
        if self.upstream.unix_path is not None:
            _, up = await loop.create_unix_connection(factory, self.upstream.unix_path)
            return up
        if self._addresses is None:
            self._addresses = await loop.getaddrinfo(self.upstream.host, self.upstream.port, type=socket.SOCK_STREAM)
        last: OSError | None = None
        for family, type_, proto, _, address in self._addresses:
            sock = socket.socket(family, type_, proto)
            try:
                sock.setblocking(False)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, UPSTREAM_RCVBUF_BYTES)
                await loop.sock_connect(sock, address)
                _, up = await loop.create_connection(factory, sock=sock)
                return up
            except OSError as exc:
                sock.close()
                last = exc
            except BaseException:
                sock.close()
                raise
        self._addresses = None  # resolve again next time
        raise last or OSError("no address for the upstream")

    async def _connect(self, exchange: Waiter) -> None:
        try:
            up = await asyncio.wait_for(self.open_connection(), self.connect_timeout)
        except TimeoutError:
            self._closed_one()
            self.note_connect(False)
            log.warning("proxy.upstream_timeout", path=exchange.path)
            exchange.fail(answers.CONNECT_TIMEOUT, Outcome.UPSTREAM_ERROR)
            return
        except OSError as exc:
            self._closed_one()
            if exc.errno in _EMFILE:
                log.error("proxy.emfile", error=str(exc), inflight=exchange.inflight_count())
                exchange.fail(answers.OUT_OF_FDS, Outcome.UPSTREAM_ERROR)
                return
            self.note_connect(False)
            log.warning("proxy.upstream_error", error=repr(exc), path=exchange.path)
            exchange.fail(answers.UNREACHABLE, Outcome.UPSTREAM_ERROR)
            return
        except BaseException:
            self._closed_one()
            raise
        self.note_connect(True)
        self.connections.add(up)
        if exchange.finished:  # the client left (or the deadline hit) while connecting
            self.release(up)
            return
        exchange.attach(up, reused=False)

    async def warm(self, n: int) -> int:
        """Open ``n`` connections ahead of a burst and keep them idle; returns how many opened. The
        activator opens a pod's pool so: the requests it held then go out in arrival order, each
        head written at once on an open connection, none overtaking another while connecting. The
        first connection opened is the first taken (the server accepted it first, so it reads it
        first)."""
        opened: list[UpstreamConnection] = []

        async def one() -> None:
            self.open += 1
            try:
                up = await asyncio.wait_for(self.open_connection(), self.connect_timeout)
            except (OSError, TimeoutError):
                self._closed_one()
                return
            except BaseException:
                self._closed_one()
                raise
            self.connections.add(up)
            opened.append(up)

        await asyncio.gather(*(one() for _ in range(n)))
        for up in reversed(opened):  # (taken last in, first out)
            self.release(up)
        return len(opened)

    def close(self) -> None:
        """At exit: close every connection (in-flight ones were finished or aborted before)."""
        if self._sweeper is not None:
            self._sweeper.cancel()
        for task in self._connecting:
            task.cancel()
        for up in self.idle:
            up.idle_at = None
        self.idle.clear()
        for up in list(self.connections):
            if up.transport is not None:
                up.transport.abort()
