"""Stand-ins for the pods' routers in operator-level tests: one small aiohttp app answering
``/admin/inflight`` on the admin port of every emulated pod IP (127.0.0.2, .3, ...), each IP with
its own answer that a test sets. The real routers come in the integration tests."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web

from drain_router.controller import probe
from drain_router_dev import process as process_

IPS = tuple(f"127.0.0.{n}" for n in range(2, 14))


class FakeRouters:
    def __init__(self, port: int) -> None:
        self.port = port
        self.answers: dict[str, tuple[int, Any]] = {}
        """ip -> (status, body); unset IPs answer idle, serving, having served."""
        self.idle_since = time.time() - 3600
        self.asked: list[str] = []
        """The IPs probed, in order."""

    def idle(self, ip: str) -> None:
        self.answers.pop(ip, None)

    def busy(self, ip: str, inflight: int = 1) -> None:
        self.answers[ip] = (
            200,
            {"inflight": inflight, "state": "serving", "idle_since": None, "started_at": 0.0, "served": 5},
        )

    def queued(self, ip: str, queued: int) -> None:
        """Nothing in flight, ``queued`` requests waiting in the router's admission queue."""
        self.answers[ip] = (
            200,
            {"inflight": 0, "queued": queued, "state": "serving", "idle_since": None, "started_at": 0.0, "served": 5},
        )

    def answer(self, ip: str, status: int, body: Any) -> None:
        self.answers[ip] = (status, body)

    async def _inflight(self, request: web.Request) -> web.Response:
        ip = request.transport.get_extra_info("sockname")[0] if request.transport else ""
        self.asked.append(ip)
        status, body = self.answers.get(
            ip,
            (200, {"inflight": 0, "state": "serving", "idle_since": self.idle_since, "started_at": 0.0, "served": 5}),
        )
        text = body if isinstance(body, str) else json.dumps(body)
        return web.Response(status=status, text=text, content_type="application/json")


@contextlib.asynccontextmanager
async def running(ips: tuple[str, ...] = IPS) -> AsyncIterator[FakeRouters]:
    routers = FakeRouters(process_.free_port())
    app = web.Application()
    app.router.add_get(probe.PATH, routers._inflight)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        for ip in ips:
            await web.TCPSite(runner, ip, routers.port).start()
        yield routers
    finally:
        await runner.cleanup()
