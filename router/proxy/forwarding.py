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
from aiohttp.http import HttpVersion10, HttpVersion11
from yarl import URL

from router import logs
from router.proxy import state as state_mod
from router.proxy.rewrite import BadTarget, request_headers, response_headers, upstream_url

log = logs.get("drain_router.proxy")

_EMFILE = frozenset({errno.EMFILE, errno.ENFILE})

#: Most bytes relayed per read from the upstream, and the upstream reader's buffer size: with the
#: client transport's high-water mark, what one stalled reader can hold in the router.
RELAY_CHUNK_BYTES = 8 * 1024

#: Bytes queued for a client before the relay waits for it to read (the transport's high-water mark).
CLIENT_HIGH_WATER_BYTES = 16 * 1024

#: Responses with a Content-Length up to this size are relayed in one write instead of streamed.
SMALL_BODY_BYTES = 64 * 1024

_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"

#: The HTTP versions proxied; anything else is refused 400.
HTTP_1X = frozenset({HttpVersion10, HttpVersion11})


class BodyTooLarge(Exception):
    pass


def error_response(status: int, kind: str, message: str) -> web.Response:
    """A router-made JSON error. ``message`` is static text: never an address or exception (the log
    has those)."""
    body = json.dumps({"error": {"type": kind, "message": message, "code": status}})
    return web.Response(status=status, text=body, content_type="application/json")


def _closing(response: web.Response) -> web.Response:
    response.force_close()
    return response


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


def _client_gone(request: web.BaseRequest) -> bool:
    transport = request.transport
    return transport is None or transport.is_closing()


async def proxy(
    request: web.BaseRequest,
    st: state_mod.RouterState,
    session: aiohttp.ClientSession,
    mark: Mark,
    base: URL,
    log_bad_target: logs.RateLimited,
) -> web.StreamResponse:
    """Forward one request. The in-flight count covers this whole function, on every path.

    ``mark`` is applied to every response before it is prepared (``Connection: close`` while draining).
    Outcomes name the side that failed: ``client_aborted`` when the client left (also when a write to
    it failed), ``rejected`` for a request the router refuses, ``upstream_error`` only for the model
    server's failures.
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
        if request.version not in HTTP_1X:
            # llhttp reports a request line without a version as HTTP/0.9; aiohttp would answer in
            # kind. Refuse it in HTTP/1.1, and close.
            request._message = request._message._replace(version=HttpVersion11)
            request = request.clone()  # a fresh object: the old one has cached its version
            outcome, code = "rejected", 400
            return await _sent(
                request, _closing(error_response(400, "bad_request", "the request is not valid HTTP/1.1")), mark
            )
        try:
            if request.method == hdrs.METH_CONNECT:
                raise BadTarget(request.raw_path)
            url = upstream_url(base, request.raw_path)
        except BadTarget:
            outcome, code = "rejected", 400
            log_bad_target.emit(method=request.method, target=request.raw_path[:120])
            return await _error(
                request, mark, 400, "bad_request_target", "only origin-form request targets (/path?query) are proxied"
            )
        if request.headers.get(hdrs.UPGRADE):
            outcome = "rejected"
            code = 501
            # Close the connection: the body of the refused request (and anything pipelined behind
            # it) must not be read as a next request.
            return await _sent(
                request,
                _closing(
                    error_response(
                        501,
                        "upgrade_not_supported",
                        "WebSocket and other Upgrade requests are not supported by drain-router v1",
                    )
                ),
                mark,
            )
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

        try:
            upstream = await session.request(
                request.method,
                url,
                headers=request_headers(request),
                data=body,
                allow_redirects=False,
                compress=None,
            )
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if too_large:
                outcome, code = "rejected", 413
                return await _error(
                    request, mark, 413, "request_too_large", f"request body is larger than {limit} bytes"
                )
            if _client_gone(request):
                # The client left while its body was being sent: its failure, not the model server's.
                raise ConnectionResetError("the client left while its request was sent") from exc
            outcome = "upstream_error"
            if _is_emfile(exc):
                code = 503
                log.error("proxy.emfile", error=str(exc), inflight=len(st.inflight))
                return await _error(
                    request,
                    mark,
                    503,
                    "out_of_file_descriptors",
                    "the router is out of file descriptors; retry on another replica",
                )
            st.note_connect(False)
            if isinstance(exc, asyncio.TimeoutError):
                code = 504
                log.warning("proxy.upstream_timeout", path=request.path)
                return await _error(request, mark, 504, "upstream_timeout", "connecting to the model server timed out")
            code = 502
            log.warning("proxy.upstream_error", error=repr(exc), path=request.path)
            return await _error(request, mark, 502, "upstream_unavailable", "the model server is unreachable")

        st.note_connect(True)
        code = upstream.status
        length = upstream.content_length
        if length is not None and length <= SMALL_BODY_BYTES and request.method != hdrs.METH_HEAD:
            # A small body of known size: read it and send headers and body in one write (one
            # syscall instead of three); streams (chunked, SSE) never take this path.
            try:
                body_bytes = await upstream.read()
            except (TimeoutError, aiohttp.ClientError) as exc:
                # Nothing was sent yet, so the client can still be told.
                outcome, code = "upstream_error", 502
                log.warning("proxy.upstream_cut", error=repr(exc), path=request.path)
                return await _error(
                    request, mark, 502, "upstream_unavailable", "the model server closed the response early"
                )
            small = web.Response(
                status=upstream.status, reason=upstream.reason, headers=response_headers(upstream), body=body_bytes
            )
            st.metrics.ttfb.observe(loop.time() - start)
            return await _sent(request, small, mark)
        response = mark(
            web.StreamResponse(status=upstream.status, reason=upstream.reason, headers=response_headers(upstream))
        )
        await response.prepare(request)
        st.metrics.ttfb.observe(loop.time() - start)
        content = upstream.content
        writer = request.writer
        if (transport := request.transport) is not None:
            transport.set_write_buffer_limits(high=CLIENT_HIGH_WATER_BYTES)
        while True:
            # Whatever has arrived, up to RELAY_CHUNK_BYTES (SSE events go out as they come); then wait
            # while the client's socket buffer is above its high-water mark, so a client that stops
            # reading holds the upstream back instead of growing the router's memory. A failed read
            # is the model server's failure; a failed write (ConnectionError) is the client's.
            try:
                chunk = await content.read(RELAY_CHUNK_BYTES)
            except (TimeoutError, aiohttp.ClientError) as exc:
                # The upstream died after the status went out; it can no longer change. Close the
                # client connection without the terminating chunk, so the client sees the stream cut.
                outcome = "upstream_error"
                log.warning("proxy.upstream_cut", error=repr(exc), path=request.path)
                request.protocol.force_close()
                return response
            if not chunk:
                break
            await response.write(chunk)
            if transport is not None and transport.get_write_buffer_size() > CLIENT_HIGH_WATER_BYTES:
                await writer.drain()  # the client is behind: wait for it (aiohttp alone would only every 64 KiB)
        await response.write_eof()
        return response
    except asyncio.CancelledError as exc:
        outcome = "deadline_aborted" if exc.args and exc.args[0] == state_mod.ABORT_MESSAGE else "client_aborted"
        raise
    except ConnectionError:
        # The client went away while we were writing to it (aiohttp's ClientConnectionResetError is
        # also a ClientError: it is caught here first, as the client's failure).
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
            log.info(
                "request",
                method=request.method,
                path=request.path,
                status=code,
                outcome=outcome,
                duration_s=round(duration, 6),
                remote=request.remote,
            )
