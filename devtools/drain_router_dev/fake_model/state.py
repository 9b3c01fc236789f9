"""What one fake model server has seen and what a test may steer: :class:`State`, kept on the app.

Everything the server counts and everything a test may steer (``healthy``) or wait for
(``request_seen``, ``cancel_seen``) lives here, apart from the handlers that change it. Completions in
flight are tracked as tasks (:class:`Generating`), so a shutdown can wait for them and abort exactly
the ones still running at its deadline.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
from typing import Any

from aiohttp import web

from drain_router_dev.fake_model import openai
from drain_router_dev.fake_model.batch import Batch
from drain_router_dev.fake_model.calls import GrpcCalls
from drain_router_dev.fake_model.session import Session


@dataclasses.dataclass(slots=True, eq=False)
class State:
    """What one fake model server has seen. ``active`` is derived, so it can never drift."""

    started: int = 0
    """Completions (and ``/sse`` streams) whose handler began."""
    finished: int = 0
    """Completions written to the end (``[DONE]`` for streams)."""
    cancelled: int = 0
    """Completions abandoned: the client went away, or a shutdown aborted them at its deadline."""
    max_active: int = 0
    """The most completions (and ``/sse`` streams) ever running at once: the peak of ``active``, so
    a test can check from outside that a proxy never let more than N reach the model server."""
    batch: Batch = dataclasses.field(default_factory=Batch)
    """The completions generating now, which share the engine's capacity (``--batch-size``)."""
    healthy: bool = True
    """``/health`` answers 200 (and the gRPC ``HealthCheck`` healthy) only while this is true and no
    shutdown started; tests flip it."""
    shutting_down: bool = False
    last_headers: dict[str, str] = dataclasses.field(default_factory=dict)
    """The headers of the last completion, ``/sse`` or ``/echo`` request."""
    seen_ids: set[str] = dataclasses.field(default_factory=set)
    """``id`` query values of the completions and streams that reached the server."""
    request_seen: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    cancel_seen: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    inflight: set[asyncio.Task[Any]] = dataclasses.field(default_factory=set)
    """The handler tasks of the completions running now."""
    busy: set[object] = dataclasses.field(default_factory=set)
    """The connections (aiohttp's ``request.protocol``) with a request being handled: the others are
    idle keep-alive connections, which a shutdown closes at once."""
    sessions: dict[Session, asyncio.Task[Any]] = dataclasses.field(default_factory=dict)
    """The ``/v1/realtime`` sessions open now, with their handler tasks."""
    sessions_opened: int = 0
    session_ends: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    """How the sessions that ended did: ``client_<code>`` (the client sent a Close with that code),
    ``server_<code>`` (this server closed first: 1001 at a shutdown), ``abnormal`` (the connection
    was lost without a Close)."""
    session_seen: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    grpc: GrpcCalls = dataclasses.field(default_factory=GrpcCalls)
    metrics_scrapes: int = 0
    """``GET /metrics`` answered (the engine's metrics, as the router's /engine/metrics relays them)."""
    """The gRPC endpoint's calls (``--grpc-port``), counted apart from the HTTP completions."""

    @property
    def active(self) -> int:
        return self.started - self.finished - self.cancelled

    @property
    def status(self) -> str:
        """``ok`` while serving; ``unhealthy`` (a test flipped ``healthy``) or ``shutting_down`` else:
        what ``/health`` and the gRPC ``HealthCheck`` answer."""
        if self.shutting_down:
            return "shutting_down"
        return "ok" if self.healthy else "unhealthy"

    def stats(self) -> dict[str, Any]:
        return {
            "started": self.started,
            "finished": self.finished,
            "cancelled": self.cancelled,
            "active": self.active,
            "max_active": self.max_active,
            "sessions": len(self.sessions),
            "sessions_opened": self.sessions_opened,
            "sessions_closed": sum(self.session_ends.values()),
            "grpc": self.grpc.stats(),
        }


SETTINGS = web.AppKey("settings", openai.Settings)
STATE = web.AppKey("state", State)


class Generating:
    """Counts one generation from start to end, whatever ends it, and tracks its task while it runs."""

    def __init__(self, request: web.Request) -> None:
        self.state = request.app[STATE]
        self.state.last_headers = dict(request.headers)
        if "id" in request.query:
            self.state.seen_ids.add(request.query["id"])

    def __enter__(self) -> None:
        self.state.started += 1
        self.state.max_active = max(self.state.max_active, self.state.active)
        self.state.request_seen.set()
        task = asyncio.current_task()
        assert task is not None
        self.state.inflight.add(task)
        task.add_done_callback(self.state.inflight.discard)

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        if kind is None:
            self.state.finished += 1
        elif issubclass(kind, (asyncio.CancelledError, ConnectionError)):
            # The client went away (a write to a closed connection, or aiohttp's handler cancellation
            # on disconnect), or a shutdown aborted us: either way the "generation" is abandoned.
            self.state.cancelled += 1
            self.state.cancel_seen.set()
