"""The admin listener: aiohttp's server for the endpoints of :mod:`router.proxy.health`, kept plain.

- **A caller that leaves is gone at once**: aiohttp's ``handler_cancellation`` cancels a request's
  handler from the connection's ``connection_lost``, which the event loop calls as soon as the client
  closes or resets the connection. A ``/admin/drain-wait`` hold, which writes nothing until the drain
  ends, frees its slot right then instead of at its timeout (up to the whole grace), so callers that
  disconnect can never lock the kubelet's preStop hook out with ``too_many_waiters``. This needs no
  polling of ``transport.is_closing()`` and covers every handler, not only the ones that remember to
  watch their transport.
- **Plain protocol errors**: a request aiohttp's parser refuses (bad request line, bad header, a line
  too large) gets a static JSON body (400, or 431 for a line too large) and ``Server: drain-router``;
  the parser's message, which echoes the client's bytes, and the framework and Python versions never
  reach the client. Each is logged as one rate-limited ``admin.bad_request`` line, not as an error
  with a traceback. Every other admin answer gets ``Server: drain-router`` from the app
  (:func:`router.proxy.health.make_admin_app`).
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import hdrs, web
from aiohttp.http_exceptions import LineTooLong

from router import logs
from router.proxy import responses

log = logs.get("drain_router.admin")

INTERNAL_ERROR = (500, "internal_error", "the admin endpoint failed; the router's log has the details")


def _static_error(status: int, exc: BaseException | None) -> tuple[int, str, str]:
    """The answer for an error aiohttp hands to ``handle_error``: static text only."""
    if isinstance(exc, LineTooLong):
        return responses.HEAD_TOO_LARGE
    if status == 400:
        return responses.BAD_REQUEST
    if status == 500:
        return INTERNAL_ERROR
    return status, "admin_error", "the admin endpoint could not answer"


class AdminRequestHandler(web.RequestHandler):
    """aiohttp's connection protocol with static, logged-once answers for protocol errors."""

    def __init__(self, server: AdminServer, **kwargs: Any) -> None:
        super().__init__(server, **kwargs)
        self.server = server

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        server = self.server
        if request.writer.output_size > 0:  # as aiohttp: a response was started, the connection is broken
            raise ConnectionError("response already started; cannot send an error response")
        code, kind, text = _static_error(status, exc)
        if code >= 500:
            server.error_log.emit(status=code, error=repr(exc), exc_info=exc)
        else:
            server.bad_request_log.emit(status=code, reason=str(message or exc)[:120])
        response = web.Response(
            status=code,
            body=responses.error_body(code, kind, text),
            content_type="application/json",
            headers={hdrs.SERVER: responses.SERVER_HEADER},
        )
        response.force_close()
        return response


class AdminServer(web.Server):
    """aiohttp's low-level server for the admin app, with handler cancellation on disconnect and
    :class:`AdminRequestHandler` for each connection."""

    def __init__(
        self,
        handler: Any,
        *,
        request_factory: Any,
        **handler_args: Any,
    ) -> None:
        super().__init__(handler, request_factory=request_factory, handler_cancellation=True, **handler_args)
        self.loop = asyncio.get_running_loop()
        self.bad_request_log = logs.RateLimited(log, "admin.bad_request", level="info")
        self.error_log = logs.RateLimited(log, "admin.internal_error", level="error")
        self._handler_args = handler_args

    def __call__(self) -> web.RequestHandler:
        """The listening socket's protocol factory: one per accepted connection."""
        return AdminRequestHandler(self, loop=self.loop, **self._handler_args)


class AdminRunner(web.AppRunner):
    """``web.AppRunner`` for the admin app, serving it with an :class:`AdminServer` (no access log)."""

    def __init__(self, app: web.Application, *, shutdown_timeout: float) -> None:
        super().__init__(app, access_log=None, shutdown_timeout=shutdown_timeout)

    async def _make_server(self) -> web.Server:
        made = await super()._make_server()  # starts and freezes the app; its handler and request factory
        return AdminServer(
            made.request_handler,
            request_factory=made.request_factory,
            access_log=None,
        )
