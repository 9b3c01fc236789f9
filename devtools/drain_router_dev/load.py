"""Streaming load: clients that stream completions and record what they saw, for the demo and e2e.

:func:`stream_completion` makes one request and returns a :class:`~drain_router_dev.streams.StreamResult`
(never raises for transport errors: they are data). :class:`Load` runs workers back to back until
told to stop, keeping a :class:`Record` per request, classified by :func:`streams.classify`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import random
import time
from collections.abc import Callable, Sequence

import aiohttp

from drain_router_dev import streams, workers

#: A stalled stream is a lost one: no chunk for this long and the client gives up.
DEFAULT_READ_TIMEOUT_SECS = 15.0
#: A slow reader's read size.
SLOW_READ_BYTES = 256


async def stream_completion(
    session: aiohttp.ClientSession,
    url: str,
    *,
    chunks: int,
    interval_ms: int,
    path: str = "/v1/completions",
    headers: dict[str, str] | None = None,
    on_response: Callable[[aiohttp.ClientResponse], None] | None = None,
    read_timeout: float = DEFAULT_READ_TIMEOUT_SECS,
    leave_after_chunks: int | None = None,
    read_delay_secs: float = 0.0,
) -> streams.StreamResult:
    """POST one streaming completion to ``url + path`` and read it to the end.

    ``leave_after_chunks``: close the stream on purpose once that many chunks arrived (a user who
    gives up; the result says ``left``). ``read_delay_secs``: a slow reader, pausing that long
    after each read of at most ``SLOW_READ_BYTES``.
    """
    body = {"model": "fake-model", "prompt": "drain", "stream": True, "chunks": chunks, "interval_ms": interval_ms}
    expected = chunks
    if path.endswith("/chat/completions"):
        body.pop("prompt")
        body["messages"] = [{"role": "user", "content": "drain"}]
        expected += 1  # the fake model's chat stream opens with a role chunk, numbered too
    status: int | None = None
    events: list[str] = []
    timeout = aiohttp.ClientTimeout(total=None, connect=5, sock_read=read_timeout)
    try:
        async with session.post(url + path, json=body, headers=headers, timeout=timeout) as resp:
            status = resp.status
            if on_response is not None:
                on_response(resp)
            decoder = streams.SSEDecoder()
            reads = resp.content.iter_chunked(SLOW_READ_BYTES) if read_delay_secs else resp.content.iter_any()
            async for data in reads:
                events.extend(decoder.feed(data))
                if (
                    leave_after_chunks is not None
                    and len(events) >= leave_after_chunks
                    and status == 200
                    and streams.DONE not in events
                ):
                    resp.close()  # drop the connection now, as a browser tab closing does
                    return streams.StreamResult(
                        status=status, events=tuple(events), expected_chunks=expected, left=True
                    )
                if read_delay_secs:
                    await asyncio.sleep(read_delay_secs)
    except (TimeoutError, aiohttp.ClientError, OSError) as exc:
        return streams.StreamResult(
            status=status, events=tuple(events), expected_chunks=expected, error=f"{type(exc).__name__}: {exc}"
        )
    return streams.StreamResult(status=status, events=tuple(events), expected_chunks=expected)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Record:
    started: float
    """``time.monotonic()`` when the request was sent."""
    finished: float
    """``time.monotonic()`` when the answer ended (or failed)."""
    outcome: streams.Outcome
    status: int | None
    error: str | None
    chunks_seen: int

    @property
    def duration(self) -> float:
        return self.finished - self.started


@dataclasses.dataclass(slots=True)
class Load:
    """``clients`` workers streaming completions from ``url`` back to back, over one pooled session."""

    url: str
    clients: int = 8
    chunks: int = 10
    interval_ms: int = 30
    path: str = "/v1/completions"
    leave_fraction: float = 0.0
    """Share of requests whose client leaves on purpose after a random number of chunks (may be
    changed while running)."""
    read_delay_secs: float = 0.0
    """Every client reads slowly, pausing this long between small reads."""
    seed: int | None = None
    """For the random choices above (which requests leave, after how many chunks)."""
    stagger: bool = False
    """Spread the clients' first requests evenly over one stream's length, so requests arrive at a
    steady rate, as from independent users, rather than in waves that all end at once."""
    records: list[Record] = dataclasses.field(default_factory=list)
    _workers: workers.SessionWorkers = dataclasses.field(default_factory=workers.SessionWorkers)
    _rng: random.Random = dataclasses.field(default_factory=random.Random)

    @property
    def lost(self) -> list[Record]:
        return [r for r in self.records if r.outcome.lost]

    async def start(self) -> None:
        self._rng = random.Random(self.seed)
        # limit=0: one pooled keep-alive connection per concurrent stream, no cap, like a gateway.
        self._workers.start(self.clients, aiohttp.TCPConnector(limit=0), self._worker)

    async def stop(self) -> list[Record]:
        """Let every worker finish its current stream, then close. Returns all records."""
        await self._workers.stop()
        return self.records

    async def _worker(self, session: aiohttp.ClientSession, index: int) -> None:
        if self.stagger:  # load shaping, not synchronisation: the i-th user arrives a little later
            await asyncio.sleep(index * self.chunks * self.interval_ms / 1000 / self.clients)
        while not self._workers.stopping.is_set():
            started = time.monotonic()
            leave = None
            if self.leave_fraction and self._rng.random() < self.leave_fraction:
                leave = self._rng.randint(1, max(1, self.chunks - 1))
            result = await stream_completion(
                session,
                self.url,
                chunks=self.chunks,
                interval_ms=self.interval_ms,
                path=self.path,
                leave_after_chunks=leave,
                read_delay_secs=self.read_delay_secs,
            )
            outcome = streams.classify(result)
            self.records.append(
                Record(
                    started=started,
                    finished=time.monotonic(),
                    outcome=outcome,
                    status=result.status,
                    error=result.error,
                    chunks_seen=sum(1 for e in result.events if e != streams.DONE),
                )
            )
            if outcome is streams.Outcome.CONNECT_ERROR:
                # Do not spin on a dead address; a real client backs off too.
                await asyncio.sleep(0.02)


def percentile(values: Sequence[float], q: float, *, ordered: bool = False) -> float | None:
    """The ``q`` (0..1) quantile by nearest rank; ``None`` for no values. ``ordered``: ``values`` are
    sorted already (several quantiles of one list, one sort)."""
    if not values:
        return None
    if not ordered:
        values = sorted(values)
    rank = max(0, min(len(values) - 1, math.ceil(q * len(values)) - 1))
    return values[rank]
