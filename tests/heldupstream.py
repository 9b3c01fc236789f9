"""A model server stand-in that holds each request until the test lets it go: what arrived, in
which order, how many at once at most (the admission tests' oracle).

    async with heldupstream.running() as up:
        ...  # POST/GET /hold?id=X waits until up.release(n) (oldest first) or up.release_all()
        up.arrived == ["a", "b"]; up.peak <= N
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from aiohttp import web


@dataclasses.dataclass(eq=False)
class HeldUpstream:
    url: str = ""
    arrived: list[str] = dataclasses.field(default_factory=list)
    """``id`` of each held request, in the order they reached this server."""
    active: int = 0
    peak: int = 0
    """The most held at once."""
    finished: int = 0
    seen_paths: list[str] = dataclasses.field(default_factory=list)
    """Every path requested, holding or not."""
    gates: list[asyncio.Event] = dataclasses.field(default_factory=list)
    released: int = 0
    free: bool = False
    """From release_all() on, requests are answered at once."""

    def release(self, n: int = 1) -> None:
        """Let the ``n`` oldest held requests answer."""
        for gate in self.gates[self.released : self.released + n]:
            gate.set()
        self.released = min(len(self.gates), self.released + n)

    def release_all(self) -> None:
        self.free = True
        self.release(len(self.gates))

    async def hold(self, request: web.Request) -> web.Response:
        self.seen_paths.append(request.path)
        await request.read()
        self.arrived.append(request.query.get("id", ""))
        self.active += 1
        self.peak = max(self.peak, self.active)
        gate = asyncio.Event()
        self.gates.append(gate)
        if self.free:
            self.release(len(self.gates))
        try:
            await gate.wait()
        finally:
            self.active -= 1
        self.finished += 1
        return web.json_response({"id": request.query.get("id", "")})

    async def plain(self, request: web.Request) -> web.Response:
        self.seen_paths.append(request.path)
        return web.json_response({"ok": True, "data": []})


@asynccontextmanager
async def running() -> AsyncIterator[HeldUpstream]:
    up = HeldUpstream()
    app = web.Application()
    app.router.add_route("*", "/hold", up.hold)
    app.router.add_get("/health", up.plain)
    app.router.add_get("/v1/models", up.plain)
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    up.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        yield up
    finally:
        up.release_all()
        await runner.cleanup()
