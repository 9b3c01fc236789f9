"""Streaming one request to the model server and its response back, counted exactly.

Nothing is buffered whole: the request body is handed to the upstream as a stream, the response is
relayed chunk by chunk as it arrives (so server-sent events reach the client token by token). A
client that disconnects cancels the handler (the server runs with ``handler_cancellation``), which
closes the upstream request at once, so the model server stops generating and frees its KV cache,
also while the upstream is silent (a long prefill, a stalled stream).
"""

from __future__ import annotations

import asyncio
import errno
import json
from collections.abc import AsyncIterator, Callable

import aiohttp
from aiohttp import hdrs, web
from multidict import CIMultiDict, CIMultiDictProxy, istr
from yarl import URL

from router import logs
from router.proxy import state as state_mod

log = logs.get("drain_router.proxy")

#: RFC 9110 section 7.6.1 plus the legacy ones still seen in the wild. Also dropped: any header
#: named in ``Connection``, and ``Expect`` (the router already answered any 100-continue). Lowercase:
#: names compare case-insensitively (gateways speaking HTTP/2 upstream send them all lowercase).
HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-connection", "proxy-authenticate", "proxy-authorization",
    "te", "trailer", "transfer-encoding", "upgrade", "expect",
})
_X_FORWARDED_FOR = istr("X-Forwarded-For")
_X_FORWARDED_PROTO = istr("X-Forwarded-Proto")
_X_FORWARDED_HOST = istr("X-Forwarded-Host")
_REPLACED_UPSTREAM = frozenset({"x-forwarded-for"})
_EMFILE = frozenset({errno.EMFILE, errno.ENFILE})

#: Responses with a Content-Length up to this size are relayed in one write instead of streamed.
SMALL_BODY_BYTES = 64 * 1024

_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


class BodyTooLarge(Exception):
    pass


def end_to_end(incoming: CIMultiDictProxy[str], also_drop: frozenset[str] = frozenset()) -> CIMultiDict[str]:
    """``incoming`` without its hop-by-hop headers (and those named in its ``Connection``), nor the
    lowercase names in ``also_drop``. Every comparison ignores case."""
    named = {token.strip().lower() for value in incoming.getall(hdrs.CONNECTION, ()) for token in value.split(",")}
    out: CIMultiDict[str] = CIMultiDict()
    for name, value in incoming.items():
        lower = name.lower()
        if lower in HOP_BY_HOP or lower in named or lower in also_drop:
            continue
        out.add(name, value)
    return out


def request_headers(request: web.BaseRequest) -> CIMultiDict[str]:
    """Headers to send upstream: hop-by-hop dropped, ``Host`` kept, ``X-Forwarded-*`` added."""
    incoming = request.headers
    out = end_to_end(incoming, _REPLACED_UPSTREAM)
    prior = incoming.getall(_X_FORWARDED_FOR, ())
    peer = request.remote or ""
    out[_X_FORWARDED_FOR] = ", ".join([*prior, peer]) if prior else peer
    out[_X_FORWARDED_PROTO] = request.scheme
    if (host := incoming.get(hdrs.HOST)) is not None:
        out[_X_FORWARDED_HOST] = host
    return out


def response_headers(upstream: aiohttp.ClientResponse) -> CIMultiDict[str]:
    """Headers to send the client: hop-by-hop (and those named in ``Connection``) dropped."""
    return end_to_end(upstream.headers)


def error_response(status: int, kind: str, message: str) -> web.Response:
    body = json.dumps({"error": {"type": kind, "message": message, "code": status}})
    return web.Response(status=status, text=body, content_type="application/json")


async def _limited(stream: aiohttp.StreamReader, limit: int, flag: list[bool]) -> AsyncIterator[bytes]:
    """Relay a body of unknown length, refusing it once it passes ``limit`` bytes."""
    seen = 0
    async for chunk in stream.iter_any():
        seen += len(chunk)
        if seen > limit:
            flag.append(True)
            raise BodyTooLarge()
        yield chunk


def _is_emfile(exc: BaseException) -> bool:
    if isinstance(exc, aiohttp.ClientConnectorError):
        return exc.os_error.errno in _EMFILE
    return isinstance(exc, OSError) and exc.errno in _EMFILE


Mark = Callable[[web.StreamResponse], web.StreamResponse]


async def _sent(request: web.BaseRequest, response: web.Response, mark: Mark) -> web.Response:
    """Write a whole response now, inside the handler: in-flight covers it to its last byte (aiohttp
    would otherwise write it after the handler returned, after the request left the count)."""
    await mark(response).prepare(request)
    await response.write_eof()
    return response


async def _error(request: web.BaseRequest, mark: Mark, status: int, kind: str, message: str) -> web.Response:
    return await _sent(request, error_response(status, kind, message), mark)


async def proxy(
    request: web.BaseRequest, st: state_mod.RouterState, session: aiohttp.ClientSession, mark: Mark
) -> web.StreamResponse:
    """Forward one request. The in-flight count covers this whole function, on every path.

    ``mark`` is applied to every response before it is prepared (``Connection: close`` while draining).
    """
    task = asyncio.current_task()
    assert task is not None
    loop = asyncio.get_running_loop()
    start = loop.time()
    st.inflight.enter(task)
    code = 0
    outcome = "completed"
    upstream: aiohttp.ClientResponse | None = None
    try:
        if request.headers.get(hdrs.UPGRADE):
            outcome = "rejected"
            code = 501
            return await _error(request, mark, 501, "upgrade_not_supported",
                                "WebSocket and other Upgrade requests are not supported by drain-router v1")
        limit = st.config.proxy.max_request_body_bytes
        length = request.content_length
        if length is not None and length > limit:
            outcome, code = "rejected", 413
            return await _error(request, mark, 413, "request_too_large", f"request body is larger than {limit} bytes")

        too_large: list[bool] = []
        body: object = None
        if request.body_exists:
            if request.headers.get(hdrs.EXPECT, "").lower() == "100-continue" and request.version >= (1, 1):
                await request.writer.write(_CONTINUE)  # what aiohttp's Application would have done
                request.writer.output_size = 0
            body = request.content if length is not None else _limited(request.content, limit, too_large)

        url = URL(st.config.proxy.upstream.base_url + request.raw_path, encoded=True)
        try:
            upstream = await session.request(
                request.method, url, headers=request_headers(request), data=body,
                allow_redirects=False, compress=None,
            )
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - every failure before headers maps to one answer
            if too_large:
                outcome, code = "rejected", 413
                return await _error(request, mark, 413, "request_too_large",
                                    f"request body is larger than {limit} bytes")
            outcome = "upstream_error"
            if _is_emfile(exc):
                code = 503
                log.error("proxy.emfile", error=str(exc), inflight=len(st.inflight))
                return await _error(request, mark, 503, "out_of_file_descriptors",
                                    "the router is out of file descriptors; retry on another replica")
            if isinstance(exc, asyncio.TimeoutError):
                code = 504
                return await _error(request, mark, 504, "upstream_timeout", "connecting to the model server timed out")
            code = 502
            log.warning("proxy.upstream_error", error=repr(exc), path=request.path)
            return await _error(request, mark, 502, "upstream_unavailable", f"the model server is unreachable: {exc}")

        code = upstream.status
        length = upstream.content_length
        if length is not None and length <= SMALL_BODY_BYTES and request.method != hdrs.METH_HEAD:
            # A small body of known size: read it and send headers and body in one write (one
            # syscall instead of three); streams (chunked, SSE) never take this path.
            try:
                body_bytes = await upstream.read()
            except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                # Nothing was sent yet, so the client can still be told.
                outcome, code = "upstream_error", 502
                log.warning("proxy.upstream_cut", error=repr(exc), path=request.path)
                return await _error(request, mark, 502, "upstream_unavailable",
                                    "the model server closed the response early")
            small = web.Response(status=upstream.status, reason=upstream.reason,
                                 headers=response_headers(upstream), body=body_bytes)
            st.metrics.ttfb.observe(loop.time() - start)
            return await _sent(request, small, mark)
        response = mark(web.StreamResponse(status=upstream.status, reason=upstream.reason,
                                           headers=response_headers(upstream)))
        await response.prepare(request)
        st.metrics.ttfb.observe(loop.time() - start)
        content = upstream.content
        try:
            while chunk := await content.readany():  # whatever has arrived: SSE events go out as they come
                await response.write(chunk)
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            # The upstream died after the status went out; it can no longer change. Close the client
            # connection without the terminating chunk, so the client sees the stream as cut.
            outcome = "upstream_error"
            log.warning("proxy.upstream_cut", error=repr(exc), path=request.path)
            request.protocol.force_close()
            return response
        await response.write_eof()
        return response
    except asyncio.CancelledError as exc:
        outcome = "deadline_aborted" if exc.args and exc.args[0] == state_mod.ABORT_MESSAGE else "client_aborted"
        raise
    except ConnectionError:
        # The client went away while we were writing to it.
        outcome = "client_aborted"
        raise
    finally:
        if upstream is not None:
            # Closing an unfinished response closes its connection: the model server sees the
            # request cancelled. A finished one goes back to the pool.
            if outcome == "completed":
                upstream.release()
            else:
                upstream.close()
        st.inflight.leave(task)
        duration = loop.time() - start
        st.metrics.count_request(code, outcome, duration)
        if st.config.log.access_log:
            log.info("request", method=request.method, path=request.path, status=code, outcome=outcome,
                     duration_s=round(duration, 6), remote=request.remote)
