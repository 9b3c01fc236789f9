"""One ``/v1/realtime`` session of the fake model: OpenAI-Realtime-shaped events over a WebSocket.

:class:`Session` reads client events, runs one response at a time and writes server events; the
handler that opens it and the shutdown that closes every open one are :mod:`.app`'s, and the count of
how sessions ended is :class:`.state.State`'s (:func:`end_of` names each end).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import uuid
from typing import Any

import aiohttp
from aiohttp import web

from drain_router_dev.fake_model import openai, realtime

#: How long a session waits for the client's Close reply after sending its own (aiohttp's default is 10 s).
SESSION_CLOSE_TIMEOUT_SECS = 2.0
#: The Close code a shutdown sends to the sessions still open at its deadline (RFC 6455 §7.4.1).
GOING_AWAY = int(aiohttp.WSCloseCode.GOING_AWAY)


class Session:
    """One realtime session: reads client events, runs one response at a time, writes server events."""

    def __init__(self, ws: web.WebSocketResponse, settings: openai.Settings) -> None:
        self.ws, self.settings = ws, settings
        self.responding: asyncio.Task[None] | None = None
        self.server_close: int | None = None
        """The code of the Close this server sent first (a shutdown's), if it did."""
        prefix = "evt_" + uuid.uuid4().hex[:12]
        self._ids = (f"{prefix}_{n}" for n in itertools.count())

    async def send(self, event: dict[str, Any]) -> None:
        await self.ws.send_str(json.dumps(event))

    async def respond(self, response: realtime.Response) -> None:
        rid = "resp_" + uuid.uuid4().hex[:16]
        await self.send(realtime.response_created(event_id=next(self._ids), response_id=rid))
        for seq in range(response.deltas):
            if seq and response.interval_ms:
                await asyncio.sleep(response.interval_ms / 1000)
            event = realtime.text_delta(event_id=next(self._ids), response_id=rid, seq=seq, total=response.deltas)
            await self.send(event)
        await self.send(realtime.response_done(event_id=next(self._ids), response_id=rid, deltas=response.deltas))

    async def handle(self, text: str) -> None:
        try:
            event = realtime.parse_client_event(text)
            if event["type"] == "response.create":
                if self.responding is not None and not self.responding.done():
                    raise realtime.BadEvent("conversation_already_has_active_response", "a response is in progress")
                asked = realtime.resolve_response(self.settings, event)
                self.responding = asyncio.create_task(self.respond(asked))
            elif event["type"] == "response.cancel":
                if self.responding is not None:
                    self.responding.cancel()
            elif event["type"] != "session.update":  # accepted, and nothing to change
                raise realtime.BadEvent("unknown_event", f"unknown event type {event['type']!r}")
        except realtime.BadEvent as exc:
            await self.send(realtime.error(event_id=next(self._ids), code=exc.code, message=str(exc)))

    async def run(self, request: web.Request) -> None:
        await self.ws.prepare(request)
        sid = "sess_" + uuid.uuid4().hex[:16]
        created = realtime.session_created(
            event_id=next(self._ids), session_id=sid, model=self.settings.model, server=os.getpid()
        )
        await self.send(created)
        try:
            async for msg in self.ws:  # pings are answered (autoping); a Close ends the loop (autoclose)
                if msg.type is aiohttp.WSMsgType.TEXT:
                    await self.handle(msg.data)
                elif msg.type is aiohttp.WSMsgType.BINARY:
                    await self.send(
                        realtime.error(event_id=next(self._ids), code="invalid_event", message="events are text")
                    )
        finally:
            if self.responding is not None:
                self.responding.cancel()
                with contextlib.suppress(asyncio.CancelledError, ConnectionError):
                    await self.responding


def end_of(session: Session) -> str:
    """How ``session`` ended, as :attr:`.state.State.session_ends` counts it."""
    if session.server_close is not None:
        return f"server_{session.server_close}"
    code = session.ws.close_code
    if code is None or code == int(aiohttp.WSCloseCode.ABNORMAL_CLOSURE):
        return "abnormal"
    return f"client_{code}"
