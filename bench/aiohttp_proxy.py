"""The floor under the router: the smallest streaming aiohttp proxy (server + pooled client session
on uvloop, chunks relayed as they come), with none of the router's features (no metrics, no
in-flight set, no readiness, no header rewriting beyond hop-by-hop, no logs).

The gap between this and the router is what the router's features cost; the gap between this and
nginx is what aiohttp costs. Run: ``python -m bench.aiohttp_proxy --upstream http://127.0.0.1:8000 --port 8080``.
"""

from __future__ import annotations

import argparse

import aiohttp
from aiohttp import web

HOP = {"connection", "keep-alive", "transfer-encoding", "upgrade", "te", "trailer", "proxy-connection"}
SESSION = web.AppKey("session", aiohttp.ClientSession)
UPSTREAM = web.AppKey("upstream", str)


async def proxy(request: web.Request) -> web.StreamResponse:
    session = request.app[SESSION]
    headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP}
    body = request.content if request.body_exists else None
    async with session.request(
        request.method, request.app[UPSTREAM] + request.raw_path, headers=headers, data=body, allow_redirects=False
    ) as upstream:
        response = web.StreamResponse(
            status=upstream.status,
            headers={k: v for k, v in upstream.headers.items() if k.lower() not in HOP},
        )
        await response.prepare(request)
        async for chunk in upstream.content.iter_any():
            await response.write(chunk)
        await response.write_eof()
        return response


async def make_app(upstream: str) -> web.Application:
    app = web.Application(client_max_size=100 * 2**20)
    app[UPSTREAM] = upstream

    async def session_ctx(app: web.Application):  # type: ignore[no-untyped-def]
        app[SESSION] = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0),
            timeout=aiohttp.ClientTimeout(total=None),
            auto_decompress=False,
            skip_auto_headers=("Accept", "Accept-Encoding", "User-Agent"),
        )
        yield
        await app[SESSION].close()

    app.cleanup_ctx.append(session_ctx)
    app.router.add_route("*", "/{tail:.*}", proxy)
    return app


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.aiohttp_proxy")
    parser.add_argument("--upstream", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    import uvloop

    web.run_app(
        make_app(args.upstream.rstrip("/")),
        host=args.host,
        port=args.port,
        access_log=None,
        handler_cancellation=True,
        print=None,
        backlog=4096,
        loop=uvloop.new_event_loop(),
    )


if __name__ == "__main__":
    main()
