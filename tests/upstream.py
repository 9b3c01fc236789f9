"""A fake streaming model server for in-process tests, observable from the test.

Routes:
- ``/sse?n=N&iv=SECS&first=SECS&pad=BYTES``: ``first`` seconds of silence (a prefill), then N events
  ``data: i`` (plus ``pad`` filler bytes) every ``iv`` seconds, then ``data: [DONE]``.
- ``/echo``: reads the whole body, answers its size, the headers it saw, and a digest.
- ``/cut?n=N``: N events, then the connection is aborted mid-stream (a crashed model server).
- ``/short``: promises a 100-byte body, sends 10 bytes, aborts.
- ``/lowercase-hops``: answers with lowercase hop-by-hop headers.
- ``/status/{code}``: an empty answer with that status.
- ``/health``: 200 while ``healthy`` is true, else 503.
It runs with ``handler_cancellation`` so it sees a cancelled request exactly as a model server does.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from aiohttp import web


class FakeUpstream:
    def __init__(self) -> None:
        self.started = 0
        self.finished = 0
        self.cancelled = 0
        self.healthy = True
        self.cancel_seen = asyncio.Event()
        self.request_seen = asyncio.Event()
        self.last_headers: dict[str, str] = {}
        self.seen_ids: set[str] = set()
        """``id`` query values of /sse requests that reached the upstream."""
        self.url = ""
        self.port = 0

    def app(self) -> web.Application:
        app = web.Application(client_max_size=1 << 31)
        app.router.add_get("/sse", self.sse)
        app.router.add_post("/v1/completions", self.sse)
        app.router.add_route("*", "/echo", self.echo)
        app.router.add_get("/cut", self.cut)
        app.router.add_get("/short", self.short)
        app.router.add_get("/lowercase-hops", self.lowercase_hops)
        app.router.add_route("*", "/status/{code}", self.status)
        app.router.add_get("/health", self.health)
        return app

    async def sse(self, request: web.Request) -> web.StreamResponse:
        self.started += 1
        self.last_headers = dict(request.headers)
        self.request_seen.set()
        if "id" in request.query:
            self.seen_ids.add(request.query["id"])
        n = int(request.query.get("n", 5))
        iv = float(request.query.get("iv", 0.01))
        first = float(request.query.get("first", 0))
        pad = "x" * int(request.query.get("pad", 0))
        try:
            if first:
                await asyncio.sleep(first)
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
            await resp.prepare(request)
            for i in range(n):
                await resp.write(f"data: {i}{pad}\n\n".encode())
                if iv:
                    await asyncio.sleep(iv)
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
        except (asyncio.CancelledError, ConnectionError):
            # Cancelled (the router closed the connection while we waited) or a write failed (it
            # closed it while we wrote): either way the model server sees the request gone.
            self.cancelled += 1
            self.cancel_seen.set()
            raise
        self.finished += 1
        return resp

    async def echo(self, request: web.Request) -> web.Response:
        self.last_headers = dict(request.headers)
        body = await request.read()
        return web.json_response(
            {
                "method": request.method,
                "path_qs": request.path_qs,
                "size": len(body),
                "sha256": hashlib.sha256(body).hexdigest(),
                "headers": dict(request.headers),
            },
            headers={"Keep-Alive": "timeout=5", "X-Upstream": "yes", "Connection": "X-Drop-Me", "X-Drop-Me": "1"},
        )

    async def cut(self, request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i in range(int(request.query.get("n", 2))):
            await resp.write(f"data: {i}\n\n".encode())
        await asyncio.sleep(0.05)
        assert request.transport is not None
        request.transport.abort()
        return resp

    async def lowercase_hops(self, request: web.Request) -> web.Response:
        """Hop-by-hop headers with lowercase names, as many servers send them."""
        return web.Response(
            text="ok",
            headers={"keep-alive": "timeout=5", "connection": "X-Drop-Lower", "x-drop-lower": "1", "x-kept": "yes"},
        )

    async def short(self, request: web.Request) -> web.StreamResponse:
        """Promise 100 bytes, send 10, die: a crash before the small body is complete."""
        resp = web.StreamResponse(headers={"Content-Length": "100"})
        await resp.prepare(request)
        await resp.write(b"0123456789")
        await asyncio.sleep(0.05)
        assert request.transport is not None
        request.transport.abort()
        return resp

    async def status(self, request: web.Request) -> web.Response:
        return web.Response(status=int(request.match_info["code"]))

    async def health(self, request: web.Request) -> web.Response:
        return web.json_response({"ok": self.healthy}, status=200 if self.healthy else 503)


@asynccontextmanager
async def running(unix_path: Path | None = None) -> AsyncIterator[FakeUpstream]:
    fake = FakeUpstream()
    runner = web.AppRunner(fake.app(), handler_cancellation=True, access_log=None)
    await runner.setup()
    site: web.BaseSite
    if unix_path is not None:
        site = web.UnixSite(runner, str(unix_path))
        await site.start()
        fake.url = f"unix:{unix_path}"
    else:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        fake.port = runner.addresses[0][1]
        fake.url = f"http://127.0.0.1:{fake.port}"
    try:
        yield fake
    finally:
        await runner.cleanup()


def sse_events(body: bytes) -> list[str]:
    return [line[len("data: ") :] for line in body.decode().split("\n") if line.startswith("data: ")]
