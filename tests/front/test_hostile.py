"""``drain-router front``, black-box, against a pod that sends hostile bytes: a stand-in pod (listed
first, so it gets the first request) writes them raw on a continuable stream, beside a well-behaved
stand-in. In each case the client gets an honest end (the pod's own end, the front's error event
after whole events, or its connection cut where an event is unfinished), never bytes the pod did not
send but that error event, and the front goes on serving (a following request is answered 200).

1. An event larger than the front follows (1 MiB, ``MAX_EVENT_BYTES``) with no blank line: relayed
   as it comes (the client has it before its end was sent: the front does not hold it), no longer
   followed; the pod's ``[DONE]`` then ends the response as the pod ended it, and a cut in the middle
   of that event cuts the client's connection (an error event appended would complete the event).
2. Events with no data (comments, a named event, ``id``/``retry`` lines) are relayed byte for byte,
   and a cut after them ends with the error event, the unfinished event never relayed.
3. An event whose data is not JSON: relayed, and the stream no longer followed; the pod's ``[DONE]``
   ends the response as the pod ended it; a cut after it ends with the error event, not continued.
4. An invalid chunk size, in the read that brought the head and an event: the head and the event
   relayed, then the error event, or the rest of the answer continued on another pod.
5. A response head that never ends (header lines without end): 502, and the pod's connection closed
   once the head's bound is past (the front reads no further).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
from collections.abc import AsyncIterator
from typing import Any

from drain_router.decisions.front import MAX_EVENT_BYTES
from drain_router.http1.sse import TRUNCATED_EVENT
from tests.front.rig import (
    DONE,
    SSE_HEAD,
    Answer,
    Rig,
    StandIn,
    Streamed,
    chunk,
    completion_event,
    metric,
    model_stats,
    post,
    sequence,
)
from tests.process import RouterProcess

STREAM: dict[str, Any] = {"model": "m", "prompt": "Count:", "stream": True, "max_tokens": 24}
"""A continuable request: the front follows its events."""
SHORT = {"model": "m", "prompt": "Hi", "max_tokens": 2}


@dataclasses.dataclass
class ClientStream:
    """One streamed response read off the wire by a client, chunk by chunk."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    status: int = 0
    body: bytes = b""
    ended: bool | None = None
    """True: the last chunk arrived; False: the connection was cut before it."""

    @classmethod
    @contextlib.asynccontextmanager
    async def open(cls, front: RouterProcess, body: dict[str, Any]) -> AsyncIterator[ClientStream]:
        """POST ``body`` to the front on a new connection, read the head; closed at the end."""
        reader, writer = await asyncio.open_connection("127.0.0.1", front.port)
        try:
            data = json.dumps(body).encode()
            writer.write(
                b"POST /v1/completions HTTP/1.1\r\nhost: front\r\ncontent-type: application/json\r\n"
                b"content-length: %d\r\n\r\n%s" % (len(data), data)
            )
            stream = cls(reader, writer)
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            stream.status = int(head.split(b" ", 2)[1])
            assert b"transfer-encoding: chunked" in head.lower(), head
            yield stream
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    async def read_until(self, size: int) -> None:
        """Until the body has ``size`` bytes (or it ends)."""
        await asyncio.wait_for(self._read(lambda: len(self.body) >= size), 10)

    async def read_to_end(self) -> bytes:
        await asyncio.wait_for(self._read(lambda: False), 10)
        return self.body

    async def _read(self, enough: Any) -> None:
        try:
            while self.ended is None and not enough():
                size = int((await self.reader.readuntil(b"\r\n")).split(b";")[0], 16)
                if size == 0:
                    await self.reader.readuntil(b"\r\n")
                    self.ended = True
                    return
                self.body += await self.reader.readexactly(size)
                await self.reader.readexactly(2)
        except (asyncio.IncompleteReadError, ConnectionError):
            self.ended = False


async def _rig_front(rig: Rig, **flags: Any) -> tuple[StandIn, StandIn, RouterProcess]:
    hostile, other = await rig.stand_in(), await rig.stand_in()
    return hostile, other, await rig.front(hostile, other, **flags)


async def _still_serves(front: RouterProcess, other: StandIn) -> None:
    """The well-behaved pod saw no continuation or retry of the hostile request, and a following
    request is answered."""
    assert other.seen == []
    assert front.port is not None
    got = await post(front.port, "/v1/completions", SHORT)
    assert got.status == 200, got
    assert await metric(front, "drain_router_front_continuations_total", outcome="continued") == 0


# -- 1. an event past the bound --------------------------------------------------------------------

BIG = b"data: " + b"x" * (MAX_EVENT_BYTES + 256 * 1024)
"""An event's first line, past the bound, with no line end."""


def _oversized(release: asyncio.Event, end: bytes | None) -> Answer:
    """The first event, then :data:`BIG` in 64 KiB chunks; once ``release`` is set, ``end`` and the
    last chunk (None: the connection is closed instead)."""

    async def write(writer: asyncio.StreamWriter) -> bool:
        writer.write(SSE_HEAD + chunk(completion_event(0)))
        for at in range(0, len(BIG), 64 * 1024):
            writer.write(chunk(BIG[at : at + 64 * 1024]))
            await writer.drain()
        await release.wait()
        if end is None:
            return False
        writer.write(chunk(end) + b"0\r\n\r\n")
        await writer.drain()
        return True

    return write


async def test_an_oversized_event_is_relayed_as_it_comes_and_the_pods_end_kept() -> None:
    async with Rig() as rig:
        hostile, other, front = await _rig_front(rig)
        release = asyncio.Event()
        hostile.answers = [_oversized(release, b"\n\n" + DONE)]
        async with ClientStream.open(front, STREAM) as stream:
            sent = completion_event(0) + BIG
            # The whole oversized event so far reaches the client before its end was even sent.
            await stream.read_until(len(sent))
            assert stream.body == sent and stream.ended is None
            release.set()
            assert await stream.read_to_end() == sent + b"\n\n" + DONE
            assert stream.ended
        await _still_serves(front, other)


async def test_an_oversized_event_cut_midway_cuts_the_clients_connection() -> None:
    async with Rig() as rig:
        hostile, other, front = await _rig_front(rig)
        release = asyncio.Event()
        release.set()
        hostile.answers = [_oversized(release, None)]
        async with ClientStream.open(front, STREAM) as stream:
            assert await stream.read_to_end() == completion_event(0) + BIG
            assert stream.ended is False
        await _still_serves(front, other)


# -- 2. events with no data -----------------------------------------------------------------------

DATALESS = (b": keep-alive\n\n", b"event: ping\n\n", b"id: 7\nretry: 100\n\n", b": crlf\r\n\r\n")


def _pieces(*pieces: bytes, end: bool) -> Answer:
    """Each piece a chunk; then the last chunk (``end``) or the connection closed."""

    async def write(writer: asyncio.StreamWriter) -> bool:
        writer.write(SSE_HEAD + b"".join(chunk(p) for p in pieces) + (b"0\r\n\r\n" if end else b""))
        await writer.drain()
        return end

    return write


async def test_events_with_no_data_are_relayed_byte_for_byte() -> None:
    async with Rig() as rig:
        hostile, other, front = await _rig_front(rig)
        events = (DATALESS[0], completion_event(0), *DATALESS[1:], completion_event(1, finish="length"), DONE)
        hostile.answers = [_pieces(*events, end=True)]
        async with ClientStream.open(front, STREAM) as stream:
            assert await stream.read_to_end() == b"".join(events)
            assert stream.ended
        await _still_serves(front, other)


async def test_a_cut_after_events_with_no_data_ends_with_the_error_event() -> None:
    async with Rig() as rig:
        hostile, other, front = await _rig_front(rig, max_continuations=0)
        whole = (DATALESS[0], completion_event(0), DATALESS[1])
        hostile.answers = [_pieces(*whole, b'data: {"id": "cmpl-sta', end=False)]
        async with ClientStream.open(front, STREAM) as stream:
            assert await stream.read_to_end() == b"".join(whole) + TRUNCATED_EVENT
            assert stream.ended
        await _still_serves(front, other)


# -- 3. data that is not JSON ---------------------------------------------------------------------

NOT_JSON = b"data: {not json\n\n"


async def test_an_event_that_is_not_json_is_relayed_and_the_pods_end_kept() -> None:
    async with Rig() as rig:
        hostile, other, front = await _rig_front(rig)
        events = (completion_event(0), NOT_JSON, completion_event(1, finish="length"), DONE)
        hostile.answers = [_pieces(*events, end=True)]
        async with ClientStream.open(front, STREAM) as stream:
            assert await stream.read_to_end() == b"".join(events)
            assert stream.ended
        assert await metric(front, "drain_router_front_continuations_total", outcome="given_up") == 0
        await _still_serves(front, other)


async def test_a_cut_after_an_event_that_is_not_json_ends_with_the_error_event() -> None:
    """No longer followed: not continued (on the other pod), the honest error instead."""
    async with Rig() as rig:
        hostile, other, front = await _rig_front(rig)
        events = (completion_event(0), NOT_JSON, completion_event(1))
        hostile.answers = [_pieces(*events, end=False)]
        async with ClientStream.open(front, STREAM) as stream:
            assert await stream.read_to_end() == b"".join(events) + TRUNCATED_EVENT
            assert stream.ended
        await _still_serves(front, other)


# -- 4. an invalid chunk size ---------------------------------------------------------------------


async def _invalid_chunk_size(writer: asyncio.StreamWriter) -> bool:
    """The head, one event, then a chunk size that is not hexadecimal: all in one write."""
    writer.write(SSE_HEAD + chunk(completion_event(0)) + b"zz\r\n" + completion_event(1) + b"\r\n")
    await writer.drain()
    return True


async def test_an_invalid_chunk_size_ends_with_the_error_event() -> None:
    async with Rig() as rig:
        hostile, other, front = await _rig_front(rig, max_continuations=0)
        hostile.answers = [_invalid_chunk_size]
        async with ClientStream.open(front, STREAM) as stream:
            assert await stream.read_to_end() == completion_event(0) + TRUNCATED_EVENT
            assert stream.ended
        await _still_serves(front, other)


async def test_an_invalid_chunk_size_is_a_cut_continued_on_another_pod() -> None:
    """The head, an event and the invalid chunk size in one read: the client gets the head and the
    event, then the rest of the answer from the other pod (a real one)."""
    async with Rig() as rig:
        hostile = await rig.stand_in()
        real = (await rig.pods(1))[0]
        front = await rig.front(hostile, real)
        hostile.answers = [_invalid_chunk_size]
        async with ClientStream.open(front, STREAM | {"interval_ms": 5}) as stream:
            got = Streamed(stream.status, {}, await stream.read_to_end())
            assert stream.ended and got.events[-1] == "[DONE]"
            assert got.text() == sequence(0, STREAM["max_tokens"])
        assert (await model_stats(real.model))["started"] == 1
        assert await metric(front, "drain_router_front_continuations_total", outcome="continued") == 1


# -- 5. a head that never ends --------------------------------------------------------------------


async def test_a_response_head_that_never_ends_gets_502_and_its_connection_closed() -> None:
    async with Rig() as rig:
        hostile, other, front = await _rig_front(rig)
        written = 0
        closed = asyncio.Event()

        async def write(writer: asyncio.StreamWriter) -> bool:
            nonlocal written
            writer.write(b"HTTP/1.1 200 OK\r\n")
            try:
                while written < 64 * 1024 * 1024:
                    line = b"x-padding-%d: %s\r\n" % (written, b"y" * 1000)
                    writer.write(line)
                    written += len(line)
                    await writer.drain()
            except ConnectionError:
                closed.set()
            return False

        hostile.answers = [write]
        assert front.port is not None
        got = await post(front.port, "/v1/completions", STREAM)
        assert got.status == 502, got
        await asyncio.wait_for(closed.wait(), 10)
        assert written < 8 * 1024 * 1024  # read no further than its bound (32 KiB) and the buffers
        await _still_serves(front, other)
