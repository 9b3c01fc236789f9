"""A pool of client workers: ``count`` copies of one client loop sharing one client object.

The demo's and e2e's loads (:mod:`drain_router_dev.load` for streams, :mod:`drain_router_dev.realtime`
for sessions, both over one pooled aiohttp session; :mod:`drain_router_dev.grpc_load` for gRPC
calls, over one grpcio channel) start their clients together and stop them together the same way:
set :attr:`Workers.stopping`, let each worker finish what it is doing, then close what they shared.
That is said here once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Generic, TypeVar

import aiohttp

S = TypeVar("S")

#: One client: the shared client object and the worker's index (0 .. count-1); it returns once
#: :attr:`Workers.stopping` is set and its current exchange is over.
Worker = Callable[[S, int], Coroutine[Any, Any, None]]


class Workers(Generic[S]):
    """Client workers sharing one client object (a session, a channel), started together, stopped
    together."""

    def __init__(self) -> None:
        self.stopping = asyncio.Event()
        """Set by :meth:`stop`: each worker finishes its current exchange and returns."""
        self._tasks: list[asyncio.Task[None]] = []
        self._close: Callable[[], Awaitable[object]] | None = None

    def start_shared(self, count: int, shared: S, worker: Worker[S], close: Callable[[], Awaitable[object]]) -> None:
        """Run ``count`` copies of ``worker`` on ``shared``; :meth:`stop` calls ``close`` once they all returned."""
        self._close = close
        self._tasks = [asyncio.create_task(worker(shared, i)) for i in range(count)]

    async def stop(self) -> None:
        """Ask every worker to stop, wait until they all have, then close what they shared."""
        self.stopping.set()
        await asyncio.gather(*self._tasks)
        if self._close is not None:
            await self._close()


class SessionWorkers(Workers[aiohttp.ClientSession]):
    """Workers over one aiohttp session."""

    def start(self, count: int, connector: aiohttp.BaseConnector, worker: Worker[aiohttp.ClientSession]) -> None:
        """Open the session on ``connector`` and run ``count`` copies of ``worker`` on it."""
        session = aiohttp.ClientSession(connector=connector)
        self.start_shared(count, session, worker, session.close)
