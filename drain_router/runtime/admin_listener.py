"""The admin listener: aiohttp's server for the endpoints of :mod:`drain_router.runtime.endpoints`, bounded and plain.

- **Connection cap**: at most ``connection_limit`` (:data:`~drain_router.runtime.tuning.ADMIN_CONNECTION_LIMIT`)
  connections at once, the admin listener's own share of the descriptor reserve. Past it a connection
  is answered 503 ``too_many_connections`` without being parsed and closed
  (:mod:`drain_router.http1.refusals`), counted and logged at most once per interval. The traffic
  listener has its own cap, so a flood on either port cannot take the other's descriptors: kubelet
  probes keep answering on the traffic port while the admin port is flooded, and the other way round.
- **Probes are never starved**: past the cap, :data:`~drain_router.runtime.tuning.ADMIN_PROBE_RESERVE`
  more connections are accepted for ``/livez`` and ``/readyz`` alone (:data:`PROBE_PATHS`): a probe
  on one is answered and the connection closed; any other request on one gets the same 503
  ``too_many_connections`` as a connection past the cap, and one that sends nothing is closed after
  :data:`ADMIN_RESERVE_IDLE_SECS`. Whatever holds the cap (scrapes, preStop holds, clients that
  never read), the kubelet's probes are answered rather than failed into a restart.
- **A client that does not read is cut**: each connection's write buffer has a high-water mark
  (:data:`ADMIN_WRITE_HIGH_WATER`); an answer held above it for :data:`ADMIN_SEND_TIMEOUT_SECS`
  (the client read nothing for that long) has its connection aborted, logged as one rate-limited
  ``admin.send_timeout`` line. Handlers write large answers (``/engine/metrics``) in chunks that
  wait for the buffer to drain, so what one connection holds is bounded by the high-water mark plus
  one chunk, and for at most the send timeout after the client stops reading.
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
import contextlib
import socket
import struct
from collections.abc import Awaitable, Callable
from typing import Any, cast

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

#: A connection whose answer stays above the write buffer's high-water mark this long is aborted: its
#: client read nothing (not even the buffer's last 48 KiB) for that long. Every admin answer is
#: read in milliseconds by a client that reads at all (a scrape of the engine's metrics, tens of KiB
#: to a few MiB, is read at once by Prometheus), and 5 s is well inside Prometheus's scrape timeout;
#: before it, 68 clients of ``/engine/metrics`` that never read held 8.5 MB each, indefinitely.
ADMIN_SEND_TIMEOUT_SECS = 5.0

#: The write buffer's high-water mark of an admin connection (the low-water mark is a quarter of it):
#: above it the connection's writers wait and the send timeout runs.
ADMIN_WRITE_HIGH_WATER = 64 * 1024

#: The paths answered on a connection of the probes' reserve.
PROBE_PATHS = frozenset({"/livez", "/readyz"})

#: A connection of the probes' reserve that sends nothing is closed after this long (a kubelet probe
#: sends its request as soon as it connects), so silent connections cannot hold the reserve.
ADMIN_RESERVE_IDLE_SECS = 1.0

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
    """aiohttp's connection protocol with static, logged-once answers for protocol errors and the send
    timeout. ``probes_only``: a connection of the probes' reserve."""

    def __init__(self, server: AdminServer, *, probes_only: bool = False, **kwargs: Any) -> None:
        super().__init__(server, **kwargs)
        self.server = server
        self.probes_only = probes_only
        self.send_timer: asyncio.TimerHandle | None = None
        """Armed while the write buffer is above its high-water mark: aborts the connection."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        cast(asyncio.WriteTransport, transport).set_write_buffer_limits(high=ADMIN_WRITE_HIGH_WATER)

    def pause_writing(self) -> None:
        super().pause_writing()
        if self.send_timer is None:
            self.send_timer = self._loop.call_later(ADMIN_SEND_TIMEOUT_SECS, self.send_timed_out)

    def resume_writing(self) -> None:
        super().resume_writing()
        self.cancel_send_timer()

    def connection_lost(self, exc: BaseException | None) -> None:
        self.cancel_send_timer()
        super().connection_lost(exc)

    def cancel_send_timer(self) -> None:
        if self.send_timer is not None:
            self.send_timer.cancel()
            self.send_timer = None

    def send_timed_out(self) -> None:
        """The client read nothing for :data:`ADMIN_SEND_TIMEOUT_SECS`: reset the connection (its handler
        is cancelled by ``connection_lost``, which frees what it held). A reset, not a close: a close
        leaves the kernel's send buffer (up to megabytes) trying to reach a client that does not read,
        for minutes; with a zero linger time the kernel drops it and the client learns at once."""
        self.send_timer = None
        transport = self.transport
        if transport is None:
            return
        self.server.send_timeout_log.emit(
            timeout_secs=ADMIN_SEND_TIMEOUT_SECS, buffered=transport.get_write_buffer_size()
        )
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        transport.abort()

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
        probe_reserve: int = tuning.ADMIN_PROBE_RESERVE,
        **handler_args: Any,
    ) -> None:
        super().__init__(self.serve, request_factory=request_factory, handler_cancellation=True, **handler_args)
        self.app_handler: Callable[[web.BaseRequest], Awaitable[web.StreamResponse]] = handler
        self.loop = asyncio.get_running_loop()
        self.connection_limit = connection_limit
        self.probe_reserve = probe_reserve
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
        self.send_timeout_log = logs.RateLimited(log, "admin.send_timeout", level="info")
        self._handler_args = handler_args

    def __call__(self) -> asyncio.Protocol:  # type: ignore[override]  # a refusal is not a RequestHandler
        """The listening socket's protocol factory: one per accepted connection."""
        if self.open >= self.connection_limit + self.probe_reserve:
            return self.refusals.protocol(open_connections=self.open, limit=self.connection_limit)
        if self.open >= self.connection_limit:
            args = {**self._handler_args, "keepalive_timeout": ADMIN_RESERVE_IDLE_SECS}
            return AdminRequestHandler(self, loop=self.loop, probes_only=True, **args)
        return AdminRequestHandler(self, loop=self.loop, **self._handler_args)

    async def serve(self, request: web.BaseRequest) -> web.StreamResponse:
        """The app's handler, but on a connection of the probes' reserve only the probes: anything
        else is refused as a connection past the cap is, and the connection closed after its answer."""
        if not getattr(request.protocol, "probes_only", False):
            return await self.app_handler(request)
        if request.path not in PROBE_PATHS:
            self.refusals.refused(open_connections=self.open, limit=self.connection_limit)
            response: web.StreamResponse = web.Response(
                status=TOO_MANY_CONNECTIONS[0],
                body=answers.error_body(*TOO_MANY_CONNECTIONS),
                content_type="application/json",
                headers={hdrs.SERVER: answers.SERVER_HEADER},
            )
        else:
            response = await self.app_handler(request)
        response.force_close()
        return response

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
