"""The open WebSocket sessions of a listener (:class:`~drain_router.http1.websocket.tunnel.Tunnel` s), counted
in ``drain_router_websocket_sessions``: closing reaches each of them, and waits for them to end."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Protocol

from prometheus_client import Gauge

from drain_router.decisions.websocket_close import AtClosing


class Session(Protocol):
    """An open tunnel, as closing reaches it."""

    def at_closing(self, action: AtClosing) -> None: ...


class OpenTunnels:
    """A listener's open tunnels, counted in ``websocket_sessions``; closing waits for them to end
    (:meth:`wait_closed`)."""

    def __init__(self, gauge: Gauge) -> None:
        self._open: set[Session] = set()
        self._gauge = gauge
        self._gone: asyncio.Event | None = None

    def __iter__(self) -> Iterator[Session]:
        return iter(list(self._open))

    def __len__(self) -> int:
        return len(self._open)

    def add(self, tunnel: Session) -> None:
        self._open.add(tunnel)
        self._gauge.inc()

    def discard(self, tunnel: Session) -> None:
        if tunnel in self._open:
            self._open.remove(tunnel)
            self._gauge.dec()
            if not self._open and self._gone is not None:
                self._gone.set()

    async def wait_closed(self, timeout: float) -> None:
        """Wait (up to ``timeout``) for the tunnels still open to end (their closing handshakes)."""
        if not self._open:
            return
        self._gone = asyncio.Event()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._gone.wait(), timeout)
