"""The admin listener: aiohttp's server for the endpoints of :mod:`drain_router.runtime.endpoints`, bounded and plain.

- **Connection cap**: at most ``connection_limit`` (:data:`~drain_router.runtime.tuning.ADMIN_CONNECTION_LIMIT`)
  connections at once, the admin listener's own share of the descriptor reserve. Past it a connection
  is answered 503 ``too_many_connections`` without being parsed and closed
  (:mod:`drain_router.http1.refusals`), counted and logged at most once per interval. The traffic
  listener has its own cap, so a flood on either port cannot take the other's descriptors: kubelet
  probes keep answering on the traffic port while the admin port is flooded, and the other way round.
- **Idle connections close** after :data:`ADMIN_KEEPALIVE_SECS`, so keep-alive connections left
  open cannot hold the cap for long.
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
  (:func:`drain_router.runtime.endpoints.make_admin_app`).
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import hdrs, web
from aiohttp.http_exceptions import LineTooLong

from drain_router import logs
from drain_router.http1 import answers
from drain_router.http1.refusals import Refusals
from drain_router.metrics import Metrics
from drain_router.runtime import tuning

log = logs.get("drain_router.admin")

#: An admin connection idle this long between requests is closed (aiohttp's default is an hour):
#: probes, scrapes and the controller's idle probe reconnect at no cost, and idle keep-alive
#: connections cannot hold the connection cap against the kubelet's probes.
ADMIN_KEEPALIVE_SECS = 5.0

TOO_MANY_CONNECTIONS = (
    503,
    "too_many_connections",
    "the admin listener is at its connection limit; retry after other admin connections close",
)
INTERNAL_ERROR = (500, "internal_error", "the admin endpoint failed; the router's log has the details")


def _static_error(status: int, exc: BaseException | None) -> tuple[int, str, str]:
    """The answer for an error aiohttp hands to ``handle_error``: static text only."""
    if isinstance(exc, LineTooLong):
        return answers.HEAD_TOO_LARGE
    if status == 400:
        return answers.BAD_REQUEST
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
            body=answers.error_body(code, kind, text),
            content_type="application/json",
            headers={hdrs.SERVER: answers.SERVER_HEADER},
        )
        response.force_close()
        return response


class AdminServer(web.Server):
    """aiohttp's low-level server for the admin app, with a connection cap, handler cancellation on
    disconnect and :class:`AdminRequestHandler` for each connection."""

    def __init__(
        self,
        handler: Any,
        *,
        request_factory: Any,
        metrics: Metrics,
        connection_limit: int,
        lingering_limit: int = tuning.ADMIN_LINGERING_REFUSED,
        **handler_args: Any,
    ) -> None:
        super().__init__(handler, request_factory=request_factory, handler_cancellation=True, **handler_args)
        self.loop = asyncio.get_running_loop()
        self.connection_limit = connection_limit
        self.open = 0
        """Connections being served (accepted and not yet lost); refused ones are not counted."""
        self.refusals = Refusals(
            metrics,
            log,
            event="admin.connection_refused",
            reason="admin_connection_limit",
            answer=answers.error(*TOO_MANY_CONNECTIONS, close=True),
            max_lingering=lingering_limit,
        )
        self.bad_request_log = logs.RateLimited(log, "admin.bad_request", level="info")
        self.error_log = logs.RateLimited(log, "admin.internal_error", level="error")
        self._handler_args = handler_args

    def __call__(self) -> asyncio.Protocol:  # type: ignore[override]  # a refusal is not a RequestHandler
        """The listening socket's protocol factory: one per accepted connection."""
        if self.open >= self.connection_limit:
            return self.refusals.protocol(open_connections=self.open, limit=self.connection_limit)
        return AdminRequestHandler(self, loop=self.loop, **self._handler_args)

    def connection_made(self, handler: web.RequestHandler, transport: asyncio.Transport) -> None:
        super().connection_made(handler, transport)
        self.open += 1

    def connection_lost(self, handler: web.RequestHandler, exc: BaseException | None = None) -> None:
        super().connection_lost(handler, exc)
        self.open -= 1


class AdminRunner(web.AppRunner):
    """``web.AppRunner`` for the admin app, serving it with an :class:`AdminServer` (no access log)."""

    def __init__(
        self, app: web.Application, *, metrics: Metrics, connection_limit: int, shutdown_timeout: float
    ) -> None:
        super().__init__(app, access_log=None, shutdown_timeout=shutdown_timeout)
        self.metrics = metrics
        self.connection_limit = connection_limit

    async def _make_server(self) -> web.Server:
        made = await super()._make_server()  # starts and freezes the app; its handler and request factory
        return AdminServer(
            made.request_handler,
            request_factory=made.request_factory,
            metrics=self.metrics,
            connection_limit=self.connection_limit,
            access_log=None,
            keepalive_timeout=ADMIN_KEEPALIVE_SECS,
        )

    def bound_port(self) -> int | None:
        """The port its one site is bound to (useful with port 0)."""
        for address in self.addresses:
            return int(address[1])
        return None
