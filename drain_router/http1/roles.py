"""What a request (an :class:`~drain_router.http1.exchange.Exchange`) needs from the layers above it:
the client connection it came on (:class:`Client`), the listener they share (:class:`Site`) and where
it goes (:class:`Destination`).
Declared here, below the exchange, so that it never imports them."""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

from drain_router import logs, tracing
from drain_router.admission.gate import Gate
from drain_router.http1 import answers
from drain_router.http1.backpressure import Reader
from drain_router.http1.heads import Headers
from drain_router.http1.upstream.connection import UpstreamConnection
from drain_router.http1.upstream.pool import UpstreamPool
from drain_router.http1.websocket.tunnel import Tunnel
from drain_router.metrics import Metrics, Outcome
from drain_router.state import InFlight, RouterState


class Finished(Protocol):
    """A request that ended, as its connection goes on after it."""

    @property
    def close(self) -> bool: ...
    @property
    def req_done(self) -> bool: ...


class Destination(Protocol):
    """Where a request goes, chosen once from its head: the admission gate it waits at and the pool
    it is forwarded through. The router's listener is its own; the activator picks one per service."""

    @property
    def gate(self) -> Gate | None: ...
    @property
    def pool(self) -> UpstreamPool | None:
        """None only while its gate holds every request (a service asleep)."""

    @property
    def host_header(self) -> bytes:
        """``Host`` for a request that came without one (HTTP/1.0)."""

    @property
    def refusal(self) -> answers.Error | None:
        """The answer instead of forwarding (the activator's: no service named, or none known)."""


class Sites(Protocol):
    """A listener's destinations when requests name where they go (the activator's services)."""

    def pick(self, headers: Headers) -> Destination: ...


class Site(Protocol):
    """What every request of a listener shares (the traffic listener)."""

    @property
    def loop(self) -> asyncio.AbstractEventLoop: ...
    @property
    def inflight(self) -> InFlight: ...
    @property
    def metrics(self) -> Metrics: ...
    @property
    def max_body(self) -> int: ...
    @property
    def access_log(self) -> bool: ...
    @property
    def gate(self) -> Gate | None: ...
    @property
    def exempt_paths(self) -> frozenset[bytes]: ...
    @property
    def state(self) -> RouterState: ...


class Reading(Site, Destination, Protocol):
    """The traffic listener, as reading requests uses it (:mod:`.reader`): the destination of
    every request unless it has :class:`Sites`."""

    @property
    def sites(self) -> Sites | None: ...

    @property
    def tracer(self) -> tracing.Tracer | None: ...

    @property
    def header_timeout(self) -> float: ...
    @property
    def bad_target_log(self) -> logs.RateLimited: ...
    @property
    def bad_request_log(self) -> logs.RateLimited: ...


class Client(Reader, Protocol):
    """The client connection a request came on, as the request acts on it."""

    transport: Any
    """None once the connection is gone."""
    close_after: bool
    """The connection closes after the response being written."""

    @property
    def listener(self) -> Site: ...
    @property
    def write_paused(self) -> bool: ...
    @property
    def peer(self) -> bytes: ...
    @property
    def tunnel(self) -> Tunnel | None: ...

    def closes_after(self, keep_alive: bool) -> bool: ...
    def open_tunnel(self, up: UpstreamConnection, early_down: bytes) -> None: ...
    def abort_for_deadline(self) -> None: ...
    def exchange_finished(self, exchange: Finished, outcome: Outcome) -> None: ...
