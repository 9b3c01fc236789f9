"""Realtime load: WebSocket clients that hold ``/v1/realtime`` sessions and record how each ended.

The sessions counterpart of :mod:`drain_router_dev.load`, on aiohttp's WebSocket client.
:func:`run_session` opens one session and keeps exchanging (``response.create``, then its events, and
again) until told to stop or until the session ends; it never raises for transport errors, they are
data (a :class:`~drain_router_dev.sessions.SessionResult`). :class:`Sessions` keeps ``clients`` sessions
open back to back (each for at most ``max_responses`` responses, if set) and reconnects at once when
one ends with 1001 (Going Away): through a balancer, the new session lands on a replica that is not
going away. :func:`handshake_status` asks once whether a URL tunnels WebSocket at all (101) or
refuses the upgrade (a router answers 501 until it tunnels).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import Callable
from typing import Any

import aiohttp

from drain_router_dev import sessions, workers

PATH = "/v1/realtime"
#: A session whose server says nothing for this long is a lost one: the client gives up.
DEFAULT_RECEIVE_TIMEOUT_SECS = 15.0
#: The handshake's deadline (connect and the 101).
HANDSHAKE_TIMEOUT_SECS = 5.0
#: How long the client waits for the server's Close reply after sending its own.
CLOSE_TIMEOUT_SECS = 5.0
#: After a session that never opened, a client waits this long before the next (no spinning on a
#: dead address; a real client backs off too).
RETRY_PAUSE_SECS = 0.02

_ENDED = (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSING, aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.ERROR)


def _timeout() -> aiohttp.ClientWSTimeout:
    return aiohttp.ClientWSTimeout(ws_receive=None, ws_close=CLOSE_TIMEOUT_SECS)


async def handshake_status(session: aiohttp.ClientSession, url: str, *, path: str = PATH) -> int | None:
    """One WebSocket handshake to ``url + path``, closed at once with 1000: the status it got (101
    when the upgrade went through), ``None`` for no answer."""
    try:
        async with asyncio.timeout(HANDSHAKE_TIMEOUT_SECS):
            ws = await session.ws_connect(url + path, timeout=_timeout(), autoping=True)
            await ws.close()
    except aiohttp.WSServerHandshakeError as exc:
        return exc.status
    except (TimeoutError, aiohttp.ClientError, OSError):
        return None
    return sessions.SWITCHING_PROTOCOLS


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Record:
    worker: int
    """Which client held the session (its sessions follow one another)."""
    started: float
    """``time.monotonic()`` when the handshake was sent."""
    finished: float
    end: sessions.End
    result: sessions.SessionResult
    server: Any
    """``session.created``'s ``server``: which replica held it (the fake model's pid)."""
    responses: int
    """Responses received whole in this session."""

    @property
    def duration(self) -> float:
        return self.finished - self.started


async def run_session(
    session: aiohttp.ClientSession,
    url: str,
    *,
    deltas: int,
    interval_ms: int,
    stop: asyncio.Event,
    path: str = PATH,
    receive_timeout: float = DEFAULT_RECEIVE_TIMEOUT_SECS,
    on_open: Callable[[], None] | None = None,
    max_responses: int | None = None,
) -> tuple[sessions.SessionResult, sessions.Tally]:
    """Open one session and ask for responses of ``deltas`` deltas, one after another, until ``stop``
    is set or ``max_responses`` responses are whole (then close with 1000 once the response in
    progress is whole) or the session ends. ``on_open`` is called once the handshake is done."""
    tally = sessions.Tally()
    try:
        async with asyncio.timeout(HANDSHAKE_TIMEOUT_SECS):
            ws = await session.ws_connect(url + path, timeout=_timeout(), autoping=True)
    except aiohttp.WSServerHandshakeError as exc:
        return sessions.SessionResult(handshake_status=exc.status, error=f"{type(exc).__name__}: {exc}"), tally
    except (TimeoutError, aiohttp.ClientError, OSError) as exc:
        return sessions.SessionResult(handshake_status=None, error=f"{type(exc).__name__}: {exc}"), tally
    if on_open is not None:
        on_open()
    client_closed, error = False, None
    create = json.dumps({"type": "response.create", "response": {"deltas": deltas, "interval_ms": interval_ms}})
    try:
        while True:
            msg = await ws.receive(timeout=receive_timeout)
            if msg.type in _ENDED:
                if msg.type is aiohttp.WSMsgType.ERROR:
                    error = f"{type(msg.data).__name__}: {msg.data}"
                break
            if msg.type is not aiohttp.WSMsgType.TEXT:
                continue
            try:
                tally.feed(json.loads(msg.data))
            except ValueError:
                tally.problem = tally.problem or "an event that is not JSON"
            if tally.problem is not None:
                client_closed = True
                await ws.close()
                break
            if not tally.responding:  # session.created, or the last response is whole
                if stop.is_set() or (max_responses is not None and tally.responses >= max_responses):
                    client_closed = True
                    await ws.close()
                    break
                await ws.send_str(create)
    except (TimeoutError, aiohttp.ClientError, OSError) as exc:
        error = f"{type(exc).__name__}: {exc}"
    finally:
        if not ws.closed:
            await ws.close()
    code = ws.close_code
    result = sessions.SessionResult(
        handshake_status=sessions.SWITCHING_PROTOCOLS,
        close_code=None if code is None else int(code),
        client_closed=client_closed,
        error=error,
        problem=tally.problem,
    )
    return result, tally


@dataclasses.dataclass(slots=True)
class Sessions:
    """``clients`` realtime sessions held open on ``url``, each reopened when it ends, until stopped."""

    url: str
    clients: int = 4
    deltas: int = 10
    interval_ms: int = 30
    path: str = PATH
    max_responses: int | None = None
    """A session closes with 1000 after this many responses (and its client opens the next);
    None: it lasts until stopped or ended by the server side."""
    records: list[Record] = dataclasses.field(default_factory=list)
    _workers: workers.SessionWorkers = dataclasses.field(default_factory=workers.SessionWorkers)
    _open: int = 0

    @property
    def open(self) -> int:
        """Sessions open now (handshake done, not ended)."""
        return self._open

    @property
    def unclean(self) -> list[Record]:
        """Sessions that did not end with a Close 1000 or 1001."""
        return [r for r in self.records if not r.end.clean]

    async def start(self) -> None:
        self._workers.start(self.clients, aiohttp.TCPConnector(limit=0, force_close=True), self._worker)

    async def stop(self) -> list[Record]:
        """Each client closes its session with 1000 once its current response is whole. Returns all records."""
        await self._workers.stop()
        return self.records

    async def _worker(self, session: aiohttp.ClientSession, index: int) -> None:
        while not self._workers.stopping.is_set():
            started = time.monotonic()
            result, tally = await self._one(session)
            end = sessions.classify(result)
            self.records.append(
                Record(
                    worker=index,
                    started=started,
                    finished=time.monotonic(),
                    end=end,
                    result=result,
                    server=tally.server,
                    responses=tally.responses,
                )
            )
            if result.handshake_status != sessions.SWITCHING_PROTOCOLS:
                await asyncio.sleep(RETRY_PAUSE_SECS)
            # Any other end: reconnect at once (a 1001 says so; after a loss a client retries too).

    async def _one(self, session: aiohttp.ClientSession) -> tuple[sessions.SessionResult, sessions.Tally]:
        opened = False

        def on_open() -> None:
            nonlocal opened
            opened = True
            self._open += 1

        try:
            return await run_session(
                session,
                self.url,
                deltas=self.deltas,
                interval_ms=self.interval_ms,
                stop=self._workers.stopping,
                path=self.path,
                on_open=on_open,
                max_responses=self.max_responses,
            )
        finally:
            if opened:
                self._open -= 1
