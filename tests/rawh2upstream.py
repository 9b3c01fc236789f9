"""A misbehaving HTTP/2 model server, frames by hand (hyperframe, hpack): it answers each request
stream with what the test scripted, so the router's checks of what the model server sends can be
driven black-box."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import hpack
from hyperframe import frame as hf

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

Answer = Callable[[int, hpack.Encoder], list[Any]]
"""Given a request's stream id and the connection's encoder: the frames to answer with (:data:`CLOSE`
among them closes the connection there)."""

CLOSE = "close"


@contextlib.asynccontextmanager
async def serving(answer: Answer) -> AsyncIterator[int]:
    """A server on a free loopback port (yielded) answering every request with ``answer``."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        encoder = hpack.Encoder()
        try:
            await reader.readexactly(len(PREFACE))
            writer.write(hf.SettingsFrame(0).serialize())
            while True:
                frame, length = hf.Frame.parse_frame_header(memoryview(await reader.readexactly(9)))
                frame.parse_body(memoryview(await reader.readexactly(length)))
                if isinstance(frame, hf.SettingsFrame) and "ACK" not in frame.flags:
                    writer.write(hf.SettingsFrame(0, flags=["ACK"]).serialize())
                elif isinstance(frame, hf.HeadersFrame):
                    for item in answer(frame.stream_id, encoder):
                        if item is CLOSE:
                            return
                        writer.write(item.serialize())
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
