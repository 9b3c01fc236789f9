"""The traffic listener's connections: aiohttp's request handler with the limits a sidecar needs.

aiohttp's ``RequestHandler`` parses requests and runs the handler; this subclass adds what it lacks
for a listener that anyone reaching the pod can connect to:

- **Header timeout**: a request's head must arrive whole within ``--client-header-timeout-secs`` of
  the connection opening (or of its first byte, for later requests on a keep-alive connection), so
  slowloris clients are closed. aiohttp bounds only the wait between requests (its keep-alive timeout).
- **Keep-alive idle timeout**: ``--client-keepalive-timeout-secs`` (aiohttp's own timer, which only
  fires while the connection waits for a request: never during a streaming response).
- **Descriptor reserve**: at most ``connection_limit`` client connections; each proxied request also
  holds an upstream connection, so past the limit a new connection is answered 503 and closed, and
  the admin listener (probes, metrics, preStop) always has descriptors left. A liveness probe that
  cannot connect would get the pod restarted and every held stream killed.
- **Malformed requests** are answered with a JSON error (431 for an oversized head, else 400),
  counted ``rejected``, logged as one rate-limited line, never as an error with a traceback.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, cast

from aiohttp import http_exceptions, web
from aiohttp.web_protocol import RequestHandler

from router import logs
from router.proxy.state import RouterState

log = logs.get("drain_router.proxy")

#: Our own ``Server`` header: no framework or version for a scanner to match.
SERVER_HEADER = "drain-router"

#: How long a refused connection may stay open for its request to be read before it is closed.
REFUSED_LINGER_SECS = 1.0
#: Refused connections that may linger at once; more are closed as soon as they are answered.
MAX_LINGERING_REFUSED = 16

_REFUSED = (
    b"HTTP/1.1 503 Service Unavailable\r\nServer: drain-router\r\nContent-Type: application/json\r\n"
    b"Connection: close\r\nContent-Length: %d\r\n\r\n%s"
)
_REFUSED_BODY = json.dumps(
    {
        "error": {
            "type": "out_of_file_descriptors",
            "message": "the router is at its connection limit; retry on another replica",
            "code": 503,
        }
    }
).encode()


def error_body(status: int, kind: str, message: str) -> str:
    return json.dumps({"error": {"type": kind, "message": message, "code": status}})


class TrafficConnection(RequestHandler):
    """One client connection of the traffic listener."""

    __slots__ = ("_header_timeout", "_header_timer", "_refused", "_state")

    def __init__(self, manager: TrafficServer, *, state: RouterState, header_timeout: float, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._state = state
        self._header_timeout = header_timeout
        self._header_timer: asyncio.TimerHandle | None = None
        self._refused = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        manager = self._manager
        assert isinstance(manager, TrafficServer)
        if manager.open_connections >= manager.connection_limit:
            # Over the limit: answer without parsing anything and close. Never registered with the
            # server, so nothing else touches this connection.
            self._refused = True
            self._state.metrics.connections_refused.labels("connection_limit").inc()
            manager.refused_log.emit(open_connections=manager.open_connections, limit=manager.connection_limit)
            # Answer at once and half-close; close fully once the request has been read (closing
            # with it unread would reset the connection and lose the answer) or after a second.
            # Past MAX_LINGERING_REFUSED of them, close at once: lingering holds descriptors too.
            transport = cast(asyncio.Transport, transport)  # uvloop's is not an asyncio.Transport subclass
            transport.write(_REFUSED % (len(_REFUSED_BODY), _REFUSED_BODY))
            if manager.lingering >= MAX_LINGERING_REFUSED or not transport.can_write_eof():
                transport.close()
                return
            manager.lingering += 1
            self.transport = transport
            transport.write_eof()
            self._header_timer = self._loop.call_later(REFUSED_LINGER_SECS, transport.close)
            return
        manager.open_connections += 1
        super().connection_made(transport)
        self._arm_header_timer()

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._refused:
            if self.transport is not None:  # it was lingering
                self.transport = None
                self._disarm_header_timer()
                cast(TrafficServer, self._manager).lingering -= 1
            return
        manager = self._manager
        if isinstance(manager, TrafficServer):
            manager.open_connections -= 1
        self._disarm_header_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            if self.transport is not None:
                self.transport.close()
            return
        if self._header_timer is None and not self._request_in_progress and not self._messages:
            self._arm_header_timer()  # the first byte of the next request on a keep-alive connection
        super().data_received(data)
        if self._messages or self._request_in_progress:
            self._disarm_header_timer()  # a whole head has been parsed

    def close_when_idle(self) -> None:
        """Close now if idle (waiting for the next request with nothing queued), else right after
        the current response. aiohttp's own ``pre_shutdown()`` only marks connections, so an idle one
        would stay open until cleanup and a pooled client would keep sending to a closing pod.
        (Reads aiohttp 3.14's waiter; the version is pinned, and a test fails if this changes.)"""
        waiter = self._waiter
        if waiter is not None and not waiter.done() and not self._messages:
            self.force_close()
        else:
            self.close()

    def _arm_header_timer(self) -> None:
        self._header_timer = self._loop.call_later(self._header_timeout, self._header_timed_out)

    def _disarm_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _header_timed_out(self) -> None:
        self._header_timer = None
        if self._messages or self._request_in_progress or self.transport is None:
            return
        manager = self._manager
        self._state.metrics.connections_refused.labels("header_timeout").inc()
        if isinstance(manager, TrafficServer):
            manager.timeout_log.emit(header_timeout_secs=self._header_timeout)
        self.force_close()

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        """A request aiohttp could not parse (or, 500, a bug): a JSON answer that leaks nothing, and
        one rate-limited log line; the connection closes."""
        if request.writer.output_size > 0 or isinstance(exc, ConnectionError):
            # The client left (a write to it failed): nothing to answer, nothing to log as an error.
            raise ConnectionError("client connection lost")
        manager = self._manager
        if status == 500:
            # A bug of ours (the proxy handler answers every failure it knows itself); it has counted
            # the request already.
            log.error("proxy.internal_error", error=repr(exc))
            kind, text = "internal_error", "the router failed to handle this request"
        elif isinstance(exc, http_exceptions.LineTooLong):
            status, kind, text = 431, "request_header_too_large", "the request line or a header is too large"
        else:
            status, kind, text = 400, "bad_request", "the request is not valid HTTP/1.1"
        if status != 500:
            if isinstance(manager, TrafficServer):
                manager.bad_request_log.emit(status=status, reason=(message or "").split("\n")[0][:120])
            self._state.metrics.count_request(status, "rejected", 0.0)
        response = web.Response(
            status=status,
            text=error_body(status, kind, text),
            content_type="application/json",
            headers={"Server": SERVER_HEADER},
        )
        response.force_close()
        return response


class TrafficServer(web.Server):
    """aiohttp's low-level server, making :class:`TrafficConnection` connections."""

    def __init__(
        self,
        handler: Any,
        *,
        state: RouterState,
        header_timeout: float,
        keepalive_timeout: float,
        connection_limit: int,
        **kwargs: Any,
    ) -> None:
        super().__init__(handler, **kwargs)
        self._state = state
        self._header_timeout = header_timeout
        self._keepalive_timeout = keepalive_timeout
        self.connection_limit = connection_limit
        self.open_connections = 0
        self.lingering = 0
        self.refused_log = logs.RateLimited(log, "proxy.connection_refused", level="warning")
        self.timeout_log = logs.RateLimited(log, "proxy.header_timeout", level="info")
        self.bad_request_log = logs.RateLimited(log, "proxy.bad_request", level="info")

    def __call__(self) -> TrafficConnection:
        return TrafficConnection(
            self,
            loop=self._loop,
            state=self._state,
            header_timeout=self._header_timeout,
            keepalive_timeout=self._keepalive_timeout,
            **self._kwargs,
        )
