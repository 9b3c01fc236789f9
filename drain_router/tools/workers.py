"""A pool of client workers: ``count`` copies of one client loop over one pooled aiohttp session.

The demo's and e2e's loads (:mod:`drain_router.tools.load` for streams, :mod:`drain_router.tools.realtime`
for sessions) start their clients together and stop them together the same way: set :attr:`Workers.stopping`,
let each worker finish what it is doing, then close the session. That is said here once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

import aiohttp

#: One client: the shared session and the worker's index (0 .. count-1); it returns once
#: :attr:`Workers.stopping` is set and its current exchange is over.
Worker = Callable[[aiohttp.ClientSession, int], Coroutine[Any, Any, None]]


class Workers:
    """Client workers sharing one session, started together, stopped together."""

    def __init__(self) -> None:
        self.stopping = asyncio.Event()
        """Set by :meth:`stop`: each worker finishes its current exchange and returns."""
        self._tasks: list[asyncio.Task[None]] = []
        self._session: aiohttp.ClientSession | None = None

    def start(self, count: int, connector: aiohttp.BaseConnector, worker: Worker) -> None:
        """Open the session on ``connector`` and run ``count`` copies of ``worker`` on it."""
        session = self._session = aiohttp.ClientSession(connector=connector)
        self._tasks = [asyncio.create_task(worker(session, i)) for i in range(count)]

    async def stop(self) -> None:
        """Ask every worker to stop, wait until they all have, then close the session."""
        self.stopping.set()
        await asyncio.gather(*self._tasks)
        if self._session is not None:
            await self._session.close()
