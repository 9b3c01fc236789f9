"""A small probe-driven load balancer for the demo, in the spirit of HAProxy or a cloud LB.

It probes every backend's ``/readyz`` each ``probe_interval`` and takes a backend out of rotation
after ``fall`` failed probes in a row (back after ``rise`` good ones), round-robins requests over
the backends in rotation, pools keep-alive connections to them, and never retries: a request sent
to a backend that refuses or drops it is answered 502, so a client sees every loss. That is the
behaviour a drain has to be correct against; it is not meant to be a production balancer.

When backends have a ``grpc_target``, it has a gRPC side too (:mod:`drain_router_dev.grpc_relay`,
on :attr:`Balancer.grpc_target`): gRPC calls go to the same rotation, round robin with the requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import time
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

import aiohttp
from aiohttp import web

from drain_router import headers as header_rules

#: Never forwarded either way: the hop-by-hop headers, plus the framing this proxy redoes itself.
HOP_BY_HOP = header_rules.HOP_BY_HOP | {"content-length"}


@dataclasses.dataclass(slots=True)
class Backend:
    name: str
    url: str
    """Where requests go, ``http://host:port``."""
    probe_url: str
    """The readiness probe, ``http://host:port/readyz``."""
    grpc_target: str | None = None
    """Where gRPC calls go, ``host:port`` (h2c), if the backend takes them."""
    in_rotation: bool = False
    """The balancer's view: does it send new requests here?"""
    active: int = 0
    """Requests (and gRPC calls) this balancer has open to the backend."""
    fails: int = 0
    oks: int = 0
    errors: Counter[str] = dataclasses.field(default_factory=Counter)
    """Requests answered 502 or cut because of this backend, by exception type."""


def _forward_headers(headers: Mapping[str, str], connection: str | None) -> list[tuple[str, str]]:
    """End-to-end headers only (repeated ones kept): hop-by-hop and those named in Connection dropped."""
    named = header_rules.named_in_connection([connection or ""])
    return [(k, v) for k, v in headers.items() if k.lower() not in HOP_BY_HOP and k.lower() not in named]


class Balancer:
    """Probe-driven round robin over ``backends``; ``on_change(backend, in_rotation)`` on each flip."""

    def __init__(
        self,
        backends: list[Backend],
        *,
        probe_interval: float = 0.5,
        fall: int = 2,
        rise: int = 1,
        on_change: Callable[[Backend, bool], None] | None = None,
    ) -> None:
        self.backends = backends
        self.probe_interval = probe_interval
        self.fall = fall
        self.rise = rise
        self.on_change = on_change
        self.port: int | None = None
        self._cycle = itertools.count()
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self._probe_session: aiohttp.ClientSession | None = None
        self._probes: asyncio.Task[None] | None = None
        self._grpc: Any = None

    @property
    def url(self) -> str:
        assert self.port is not None, "not started"
        return f"http://127.0.0.1:{self.port}"

    @property
    def grpc_target(self) -> str:
        """``127.0.0.1:PORT`` of the gRPC side (a grpcio channel's target)."""
        assert self._grpc is not None, "not started, or no backend takes gRPC"
        return f"127.0.0.1:{self._grpc.port}"

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> None:
        # limit=0: no cap on pooled upstream connections (one per concurrent stream).
        self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), auto_decompress=False)
        self._probe_session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True))
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        await site.start()
        self.port = site.port  # the bound port (port 0 picks one)
        if any(b.grpc_target for b in self.backends):
            from drain_router_dev.grpc_relay import (
                GrpcRelay,
            )  # grpcio: the devtools distribution's dependencies, loaded only if asked

            self._grpc = GrpcRelay(self.pick)
            await self._grpc.start(host)
        self._probes = asyncio.create_task(self._probe_loop())

    async def stop(self) -> None:
        if self._probes is not None:
            self._probes.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._probes
        if self._runner is not None:
            await self._runner.cleanup()
        if self._grpc is not None:
            await self._grpc.stop()
        for session in (self._session, self._probe_session):
            if session is not None:
                await session.close()

    async def probe_once(self) -> None:
        await asyncio.gather(*(self._probe(b) for b in self.backends))

    async def _probe_loop(self) -> None:
        while True:
            started = time.monotonic()
            await self.probe_once()
            await asyncio.sleep(max(0.0, self.probe_interval - (time.monotonic() - started)))

    async def _probe(self, backend: Backend) -> None:
        assert self._probe_session is not None
        try:
            async with self._probe_session.get(
                backend.probe_url, timeout=aiohttp.ClientTimeout(total=self.probe_interval)
            ) as resp:
                ok = resp.status == 200
                await resp.read()
        except (TimeoutError, aiohttp.ClientError, OSError):
            ok = False
        if ok:
            backend.oks, backend.fails = backend.oks + 1, 0
            flip = not backend.in_rotation and backend.oks >= self.rise
        else:
            backend.oks, backend.fails = 0, backend.fails + 1
            flip = backend.in_rotation and backend.fails >= self.fall
        if flip:
            backend.in_rotation = not backend.in_rotation
            if self.on_change is not None:
                self.on_change(backend, backend.in_rotation)

    def pick(self) -> Backend | None:
        ready = [b for b in self.backends if b.in_rotation]
        return ready[next(self._cycle) % len(ready)] if ready else None

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        backend = self.pick()
        if backend is None:
            return web.json_response({"error": "no backend in rotation"}, status=503)
        assert self._session is not None
        if request.headers.get("Upgrade", "").lower() == "websocket":
            return await self._websocket(request, backend)
        body = await request.read()
        headers = _forward_headers(request.headers, request.headers.get("Connection"))
        backend.active += 1
        try:
            try:
                upstream = await self._session.request(
                    request.method,
                    backend.url + request.path_qs,
                    headers=headers,
                    data=body,
                    allow_redirects=False,
                    timeout=aiohttp.ClientTimeout(total=None, connect=2),
                )
            except (TimeoutError, aiohttp.ClientError, OSError) as exc:
                backend.errors[type(exc).__name__] += 1
                return web.json_response({"error": f"backend {backend.name}: {type(exc).__name__}"}, status=502)
            try:
                response = web.StreamResponse(
                    status=upstream.status,
                    reason=upstream.reason,
                    headers=_forward_headers(upstream.headers, upstream.headers.get("Connection")),
                )
                await response.prepare(request)
                try:
                    async for data in upstream.content.iter_any():
                        await response.write(data)
                except (TimeoutError, aiohttp.ClientError, OSError) as exc:
                    backend.errors[f"{type(exc).__name__} mid-stream"] += 1
                    # The backend died mid-answer: the status is sent, so the only honest signal
                    # left is to cut the client's connection (no terminating chunk).
                    if request.transport is not None:
                        request.transport.abort()
                    return response
                await response.write_eof()
                return response
            finally:
                upstream.release()
        finally:
            backend.active -= 1

    async def _websocket(self, request: web.Request, backend: Backend) -> web.StreamResponse:
        """Relay a WebSocket session message by message, Close codes included: the backend's 1001
        reaches the client as 1001, and a backend that vanishes without a Close cuts the client's
        connection too (the client sees 1006). A refused handshake's status is relayed (501...)."""
        assert self._session is not None
        try:
            upstream = await self._session.ws_connect(
                backend.url + request.path_qs,
                headers=[(k, v) for k, v in request.headers.items() if k.lower().startswith("x-")],
                timeout=aiohttp.ClientWSTimeout(ws_close=WS_CLOSE_SECS),
                autoping=False,
            )
        except aiohttp.WSServerHandshakeError as exc:
            return web.json_response({"error": f"backend {backend.name} refused the upgrade"}, status=exc.status)
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            backend.errors[type(exc).__name__] += 1
            return web.json_response({"error": f"backend {backend.name}: {type(exc).__name__}"}, status=502)
        client = web.WebSocketResponse(autoping=False, timeout=WS_CLOSE_SECS)
        backend.active += 1
        try:
            await client.prepare(request)
            down = asyncio.create_task(_pump(upstream, client))
            up = asyncio.create_task(_pump(client, upstream))
            done, _ = await asyncio.wait((down, up), return_when=asyncio.FIRST_COMPLETED)
            if down in done and down.result() is None:  # the backend vanished without a Close
                backend.errors["WebSocket lost mid-session"] += 1
                if request.transport is not None:
                    request.transport.abort()
            await asyncio.wait((down, up), timeout=WS_CLOSE_SECS)
            for task in (down, up):
                task.cancel()
            return client
        finally:
            backend.active -= 1
            await upstream.close()


#: How long a relayed WebSocket waits for the other side's closing handshake.
WS_CLOSE_SECS = 2.0


async def _pump(
    source: web.WebSocketResponse | aiohttp.ClientWebSocketResponse,
    sink: web.WebSocketResponse | aiohttp.ClientWebSocketResponse,
) -> int | None:
    """Messages from ``source`` to ``sink`` until ``source`` ends; a Close is passed on with its
    code. Returns that code, or None when ``source`` was lost without a Close."""
    while True:
        msg = await source.receive()
        if msg.type is aiohttp.WSMsgType.TEXT:
            await sink.send_str(msg.data)
        elif msg.type is aiohttp.WSMsgType.BINARY:
            await sink.send_bytes(msg.data)
        elif msg.type is aiohttp.WSMsgType.PING:
            await sink.ping(msg.data)
        elif msg.type is aiohttp.WSMsgType.PONG:
            await sink.pong(msg.data)
        elif msg.type is aiohttp.WSMsgType.CLOSE:
            code = int(msg.data)
            await sink.close(code=code, message=msg.extra.encode() if msg.extra else b"")
            return code
        elif msg.type is aiohttp.WSMsgType.CLOSING:  # we closed it, passing the other side's Close on
            return int(source.close_code or 1000)
        else:  # CLOSED or ERROR: lost without a Close
            return None
