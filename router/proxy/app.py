"""The traffic application (probes + everything else proxied) and the upstream session.

The admin application is :func:`router.proxy.health.make_admin_app`.
"""

from __future__ import annotations

import aiohttp
from aiohttp import hdrs, web

from router import config
from router.decisions import drain
from router.proxy import forwarding, health
from router.proxy.state import RouterState


def make_session(cfg: config.Config) -> aiohttp.ClientSession:
    """One pooled keep-alive HTTP/1.1 session to the model server, shared by every request."""
    proxy = cfg.proxy
    limit = proxy.upstream_max_connections  # 0: no limit (aiohttp's default 100 would cap streams)
    connector: aiohttp.BaseConnector
    if proxy.upstream.unix_path is not None:
        connector = aiohttp.UnixConnector(path=proxy.upstream.unix_path, limit=limit, limit_per_host=0)
    else:
        connector = aiohttp.TCPConnector(limit=limit, limit_per_host=0, ttl_dns_cache=None, use_dns_cache=True)
    return aiohttp.ClientSession(
        connector=connector,
        timeout=aiohttp.ClientTimeout(total=None, sock_connect=proxy.upstream_connect_timeout().total_seconds()),
        auto_decompress=False,  # bytes pass through as the model server encoded them
        cookie_jar=aiohttp.DummyCookieJar(),  # never share one client's cookies with another
        skip_auto_headers=("Accept", "Accept-Encoding", "User-Agent", "Content-Type"),
        trust_env=False,
    )


async def _connection_close_while_draining(request: web.Request, response: web.StreamResponse) -> None:
    if drain.closes_connections(request.app[forwarding.STATE_KEY].phase):
        # This hook runs after aiohttp chose the Connection header, so set both: the header tells
        # the client, force_close() makes the server really close after this response.
        response.force_close()
        response.headers[hdrs.CONNECTION] = "close"


def make_app(state: RouterState, session: aiohttp.ClientSession) -> web.Application:
    """The traffic application. ``session`` is owned by the caller (it outlives listener shutdown)."""
    app = web.Application(client_max_size=state.config.proxy.max_request_body_bytes)
    app[forwarding.STATE_KEY] = state
    app[forwarding.SESSION_KEY] = session
    health.add_probe_routes(app)
    app.router.add_route("*", "/{tail:.*}", forwarding.proxy)
    app.on_response_prepare.append(_connection_close_while_draining)
    return app

