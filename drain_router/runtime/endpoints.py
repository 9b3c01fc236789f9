"""Probe and admin endpoints. None of them enter the in-flight count.

``/livez`` and ``/readyz`` answer on both listeners (many load balancers probe only the traffic
port); metrics and ``/admin/*`` only on the admin listener.
"""

from __future__ import annotations

import asyncio
import math

from aiohttp import hdrs, web
from prometheus_client.aiohttp import make_aiohttp_handler

from drain_router import config
from drain_router.http1.answers import SERVER_HEADER, error_body
from drain_router.runtime import engine_metrics
from drain_router.state import ALIVE, RouterState


def error_response(status: int, kind: str, message: str) -> web.Response:
    return web.Response(status=status, body=error_body(status, kind, message), content_type="application/json")


async def livez(request: web.Request) -> web.Response:
    return web.json_response(ALIVE)


async def readyz(request: web.Request) -> web.Response:
    code, body = request.app[STATE_KEY].readiness()
    return web.json_response(body, status=code)


async def inflight(request: web.Request) -> web.Response:
    return web.json_response(request.app[STATE_KEY].inflight_report())


async def admin_config(request: web.Request) -> web.Response:
    return web.json_response(config.effective(request.app[STATE_KEY].config))


#: Callers of /admin/drain-wait held at once; more are answered 503. A pod has one preStop hook per
#: container, so a handful is plenty; the cap keeps a flood of callers from holding memory and fds.
MAX_DRAIN_WAITERS = 16


async def drain_wait(request: web.Request) -> web.Response:
    """The model server's preStop hold: answer once the router has drained, or at ``timeout``.

    Called before the router is draining, it waits for the drain to start and finish. The kubelet
    sends the model server its SIGTERM only after this returns, so the model keeps generating for
    every stream the router still relays. ``timeout`` is capped at the declared grace (else
    ``MAX_SHUTDOWN_DRAIN_SECS``): no hold outlives the pod's budget. At most
    :data:`MAX_DRAIN_WAITERS` callers wait at once; a caller that disconnects has this handler
    cancelled by the admin listener and frees its slot at once, so callers that leave can never lock
    the kubelet's preStop hook out (a 503 there would have the model server signalled at once).
    """
    st = request.app[STATE_KEY]
    waiters = request.app[WAITERS_KEY]
    if waiters[0] >= MAX_DRAIN_WAITERS:
        return error_response(
            503, "too_many_waiters", f"at most {MAX_DRAIN_WAITERS} callers may wait for the drain at once"
        )
    raw = request.query.get("timeout")
    timeout: float
    if raw is None:
        timeout = st.config.drain.drain_wait_timeout_secs()
    else:
        try:
            timeout = float(raw)
        except ValueError:
            timeout = math.nan
        if not math.isfinite(timeout) or timeout < 0:
            return error_response(400, "bad_timeout", "timeout must be a non-negative number of seconds")
    timeout = min(timeout, st.config.drain.drain_wait_cap_secs())
    waiters[0] += 1
    try:
        await asyncio.wait_for(st.drain_finished.wait(), timeout)
    except TimeoutError:
        return web.json_response({"drained": False, "state": st.phase.value, "inflight": len(st.inflight)})
    finally:
        waiters[0] -= 1
    return web.json_response({"drained": st.drained_cleanly, "state": st.phase.value, "inflight": len(st.inflight)})


STATE_KEY = web.AppKey("router_state", RouterState)
WAITERS_KEY = web.AppKey("drain_waiters", list)


async def _server_header(request: web.Request, response: web.StreamResponse) -> None:
    response.headers[hdrs.SERVER] = SERVER_HEADER


def make_admin_app(state: RouterState) -> web.Application:
    app = web.Application()
    app[STATE_KEY] = state
    app[WAITERS_KEY] = [0]
    app.on_response_prepare.append(_server_header)
    app.router.add_get("/livez", livez)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", make_aiohttp_handler(state.metrics.registry))
    app.router.add_get("/admin/inflight", inflight)
    app.router.add_get("/admin/drain-wait", drain_wait)
    app.router.add_get("/admin/config", admin_config)
    engine_metrics.install(app, state.config)
    return app
