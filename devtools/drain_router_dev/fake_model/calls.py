"""What the fake model's gRPC endpoint counts: :class:`GrpcCalls`, kept on :class:`.state.State` as ``grpc``.

The work calls (vLLM's ``Generate``, the Triton-shaped ``ModelStreamInfer`` and ``Echo``) are
counted from start to end by :class:`Call`, whatever ends them; the control calls (``Abort``,
``HealthCheck``, ``grpc.health.v1``) are not. No gRPC here: grpcio ends a call whose client cancelled
it, and one still running at a shutdown's deadline, the same way (its handler is cancelled), so the
two are told apart by :attr:`GrpcCalls.abort_at`, the deadline the shutdown set before it stopped the
server.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any


@dataclasses.dataclass(frozen=True, slots=True)
class Cancellation:
    """A work call its client cancelled, and when the server noticed."""

    method: str
    request_id: str
    """``Generate``'s ``request_id``; empty for the raw-bytes methods."""
    at: float
    """``time.monotonic()`` in the server when its handler saw the cancellation: the same clock as any
    other process's on this machine, so a test can compare it with the moment it cancelled."""


@dataclasses.dataclass(slots=True, eq=False)
class GrpcCalls:
    """How the gRPC work calls ended. ``active`` is derived, so it can never drift."""

    started: int = 0
    completed: int = 0
    """Answered to the end (a ``Generate`` with every token, a stream the client half-closed)."""
    cancelled: int = 0
    """Cancelled by the client (or its connection lost) before the end: each is in ``cancellations``."""
    aborted: int = 0
    """``Generate`` calls an ``Abort`` ended (their last message has finish reason ``abort``)."""
    shutdown_aborted: int = 0
    """Still running at a shutdown's deadline: grpcio ended them (the client sees UNAVAILABLE)."""
    failed: int = 0
    """Ended by any other error in the handler."""
    cancellations: list[Cancellation] = dataclasses.field(default_factory=list)
    running: dict[str, Call] = dataclasses.field(default_factory=dict)
    """The ``Generate`` calls running now, by request id: what ``Abort`` looks up."""
    abort_at: float | None = None
    """The shutdown's deadline (``time.monotonic()``), set before the server stops: a call cancelled
    from then on was aborted by the shutdown, one cancelled before by its client."""
    call_seen: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    """Set when a work call starts."""

    @property
    def active(self) -> int:
        return self.started - self.completed - self.cancelled - self.aborted - self.shutdown_aborted - self.failed

    def stats(self) -> dict[str, Any]:
        return {
            "started": self.started,
            "completed": self.completed,
            "cancelled": self.cancelled,
            "aborted": self.aborted,
            "shutdown_aborted": self.shutdown_aborted,
            "failed": self.failed,
            "active": self.active,
            "cancellations": [dataclasses.asdict(c) for c in self.cancellations],
        }

    def abort(self, request_ids: list[str]) -> None:
        """``Abort``: end the running ``Generate`` calls with these ids at their next pause (an id that
        names none is ignored, as vLLM does)."""
        for rid in request_ids:
            if rid in self.running:
                self.running[rid].abort_requested.set()


class Call:
    """Counts one gRPC work call from start to end in :class:`GrpcCalls`, whatever ends it."""

    def __init__(self, calls: GrpcCalls, method: str, request_id: str = "") -> None:
        self.calls, self.method, self.request_id = calls, method, request_id
        self.abort_requested = asyncio.Event()
        """Set by ``Abort``: the call ends at its next pause."""
        self.aborted = False
        """Whether a pause ended early for ``Abort``: the call then ends as aborted."""

    def __enter__(self) -> Call:
        self.calls.started += 1
        if self.request_id:
            self.calls.running[self.request_id] = self
        self.calls.call_seen.set()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        if self.calls.running.get(self.request_id) is self:
            del self.calls.running[self.request_id]
        if kind is None:
            if self.aborted:
                self.calls.aborted += 1
            else:
                self.calls.completed += 1
        elif issubclass(kind, asyncio.CancelledError):
            self._cancelled(time.monotonic())
        else:
            self.calls.failed += 1

    def _cancelled(self, now: float) -> None:
        if self.calls.abort_at is not None and now >= self.calls.abort_at:
            self.calls.shutdown_aborted += 1
        else:
            self.calls.cancelled += 1
            self.calls.cancellations.append(Cancellation(self.method, self.request_id, now))

    async def pause(self, secs: float) -> bool:
        """Wait ``secs`` s (the pacing), or less if ``Abort`` comes: whether it did (the call is then
        :attr:`aborted`)."""
        if secs > 0 and not self.abort_requested.is_set():
            try:
                async with asyncio.timeout(secs):
                    await self.abort_requested.wait()
            except TimeoutError:
                pass
        self.aborted = self.abort_requested.is_set()
        return self.aborted
