"""Probe and admin endpoints. None of them enter the in-flight count.

``/livez`` and ``/readyz`` answer on both listeners (many load balancers probe only the traffic
port); metrics and ``/admin/*`` only on the admin listener.
"""

from __future__ import annotations

import asyncio
import math

from aiohttp import web
from prometheus_client.aiohttp import make_aiohttp_handler

from router import config
from router.proxy.forwarding import error_response
from router.proxy.state import RouterState


ALIVE = {"status": "alive"}


async def livez(request: web.Request) -> web.Response:
    return web.json_response(ALIVE)


async def readyz(request: web.Request) -> web.Response:
    code, body = request.app[STATE_KEY].readiness()
    return web.json_response(body, status=code)


async def inflight(request: web.Request) -> web.Response:
    return web.json_response(request.app[STATE_KEY].inflight_report())


async def admin_config(request: web.Request) -> web.Response:
    return web.json_response(config.effective(request.app[STATE_KEY].config))


async def drain_wait(request: web.Request) -> web.Response:
    """The model server's preStop hold: answer once the router has drained, or at ``timeout``.

    Called before the router is draining, it waits for the drain to start and finish. The kubelet
    sends the model server its SIGTERM only after this returns, so the model keeps generating for
    every stream the router still relays.
    """
    st = request.app[STATE_KEY]
    raw = request.query.get("timeout")
    if raw is None:
        timeout = st.config.drain.drain_wait_timeout().total_seconds()
    else:
        try:
            timeout = float(raw)
        except ValueError:
            timeout = math.nan
        if not math.isfinite(timeout) or timeout < 0:
            return error_response(400, "bad_timeout", f"timeout must be a non-negative number of seconds, got {raw!r}")
    try:
        await asyncio.wait_for(st.drain_finished.wait(), timeout)
    except asyncio.TimeoutError:
        return web.json_response({"drained": False, "state": st.phase.value, "inflight": len(st.inflight)})
    return web.json_response({"drained": st.drained_cleanly, "state": st.phase.value, "inflight": len(st.inflight)})


STATE_KEY = web.AppKey("router_state", RouterState)


def make_admin_app(state: RouterState) -> web.Application:
    app = web.Application()
    app[STATE_KEY] = state
    app.router.add_get("/livez", livez)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", make_aiohttp_handler(state.metrics.registry))
    app.router.add_get("/admin/inflight", inflight)
    app.router.add_get("/admin/drain-wait", drain_wait)
    app.router.add_get("/admin/config", admin_config)
    return app
