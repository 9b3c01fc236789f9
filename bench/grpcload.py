"""The gRPC load generator: a lean h2c client (prior knowledge) on an asyncio Protocol, plus an
h2load wrapper for unary calls.

grpcio's asyncio client costs about 37 µs of its core per streamed message here (it saturated its
core at ~26k messages/s against the fake model), so as the client of a proxy that relays a message
in ~13 µs it would be the ceiling. This client never decodes a message: it counts them across DATA
frames (:class:`bench.h2.MessageCounter`), keeps the flow-control windows open, and reads each call's
``grpc-status`` from its trailers. Every function measures its own CPU use (``loadgen_core``), as
:mod:`bench.loadgen` does.
"""

from __future__ import annotations

import asyncio
import math
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cache
from typing import Any

from bench import h2, stats
from bench.loadgen import cpu_self, run_tool

GENERATE = "/vllm.grpc.engine.VllmEngine/Generate"
ECHO = "/inference.GRPCInferenceService/Echo"
INTERVAL_HEADER = "bench-interval-ms"
#: The receive windows this client opens: per stream, and for the connection.
STREAM_WINDOW = 1 << 20
CONNECTION_WINDOW = 1 << 24


@cache
def generate_request(max_tokens: int) -> bytes:
    """A vLLM ``GenerateRequest`` for ``max_tokens`` streamed tokens, framed as a gRPC message."""
    from smg_grpc_proto.generated import vllm_engine_pb2 as pb

    request = pb.GenerateRequest(
        request_id="bench",
        stream=True,
        tokenized=pb.TokenizedInput(original_text="bench", input_ids=list(range(1, 9))),
        sampling_params=pb.SamplingParams(max_tokens=max_tokens),
    )
    return h2.grpc_message(request.SerializeToString())


def echo_request(size: int) -> bytes:
    """An Echo request: ``size`` bytes of payload, framed as a gRPC message."""
    return h2.grpc_message(b"e" * size)


# -- the client -----------------------------------------------------------------------------------


@dataclass
class Tally:
    """Messages counted by every connection of one measurement: all of them, and those that arrived
    inside the window [warm_at, end_at)."""

    warm_at: float = 0.0
    end_at: float = math.inf
    messages_total: int = 0
    messages_in_window: int = 0


@dataclass
class CallResult:
    status: str | None = None
    """The trailers' ``grpc-status``; None when the stream was reset or the connection lost."""
    messages: int = 0
    first_at: float | None = None
    error: str | None = None


class _Stream:
    __slots__ = ("counter", "done", "result", "unacked")

    def __init__(self, done: asyncio.Future[CallResult], result: CallResult) -> None:
        self.counter = h2.MessageCounter()
        self.done = done
        self.result = result
        self.unacked = 0


class Client(asyncio.Protocol):
    """One h2c connection: :meth:`call` starts a call, its future gives the :class:`CallResult`."""

    def __init__(self, authority: str, tally: Tally) -> None:
        self.authority = authority.encode()
        self.tally = tally
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.settled: asyncio.Future[None] = self.loop.create_future()
        self.lost: asyncio.Future[None] = self.loop.create_future()
        self.buf = bytearray()
        self.decoder = h2.Decoder()
        self.streams: dict[int, _Stream] = {}
        self.next_sid = 1
        self.max_streams: int | None = None
        self.conn_unacked = 0
        self.block: tuple[int, int, bytearray] | None = None
        self.heads: dict[tuple[str, tuple[tuple[str, str], ...]], bytes] = {}
        self.out: list[bytes] = []
        self.error: str | None = None

    @classmethod
    async def connect(cls, host: str, port: int, tally: Tally | None = None, timeout: float = 10.0) -> Client:
        loop = asyncio.get_running_loop()
        client = cls(f"{host}:{port}", tally or Tally())
        await asyncio.wait_for(loop.create_connection(lambda: client, host, port), timeout)
        await asyncio.wait_for(asyncio.shield(client.settled), timeout)
        return client

    # -- asyncio.Protocol -------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        opening = h2.settings({h2.SETTINGS_ENABLE_PUSH: 0, h2.SETTINGS_INITIAL_WINDOW_SIZE: STREAM_WINDOW})
        update = h2.window_update(0, CONNECTION_WINDOW - h2.DEFAULT_WINDOW)
        transport.write(h2.PREFACE + opening + update)  # type: ignore[attr-defined]

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        reason = self.error or (f"connection lost: {exc}" if exc else "connection closed")
        for stream in self.streams.values():
            if not stream.done.done():
                stream.result.error = stream.result.error or reason
                stream.done.set_result(stream.result)
        self.streams.clear()
        for future in (self.settled, self.lost):
            if not future.done():
                future.set_result(None)

    def data_received(self, data: bytes) -> None:
        self.buf += data
        found, used = h2.split(self.buf)
        del self.buf[:used]
        now = time.perf_counter()
        tally = self.tally
        counted = 0
        for kind, flags, sid, payload in found:
            if kind == h2.DATA:
                self.conn_unacked += len(payload)
                stream = self.streams.get(sid)
                if stream is None:
                    continue
                stream.unacked += len(payload)
                if stream.unacked >= STREAM_WINDOW // 2:
                    self.out.append(h2.window_update(sid, stream.unacked))
                    stream.unacked = 0
                n = stream.counter.feed(h2.data_of(flags, payload))
                if n:
                    if stream.result.first_at is None:
                        stream.result.first_at = now
                    stream.result.messages += n
                    counted += n
                if flags & h2.END_STREAM:
                    self._end(sid, None, "stream ended without trailers")
            elif kind == h2.HEADERS:
                block = h2.header_block(flags, payload)
                if flags & h2.END_HEADERS:
                    self._headers(sid, flags, block)
                else:
                    self.block = (sid, flags, bytearray(block))
            elif kind == h2.CONTINUATION and self.block is not None:
                self.block[2].extend(payload)
                if flags & h2.END_HEADERS:
                    first_sid, first_flags, whole = self.block
                    self.block = None
                    self._headers(first_sid, first_flags, bytes(whole))
            elif kind == h2.SETTINGS:
                if not flags & h2.ACK:
                    limit = h2.parse_settings(payload).get(h2.SETTINGS_MAX_CONCURRENT_STREAMS)
                    if limit is not None:
                        self.max_streams = limit
                    self.out.append(h2.frame(h2.SETTINGS, h2.ACK, 0))
                    if not self.settled.done():
                        self.settled.set_result(None)
            elif kind == h2.PING:
                if not flags & h2.ACK:
                    self.out.append(h2.frame(h2.PING, h2.ACK, 0, payload))
            elif kind == h2.RST_STREAM:
                self._end(sid, None, f"reset with code {int.from_bytes(payload, 'big')}")
            elif kind == h2.GOAWAY:
                self.error = f"GOAWAY code {int.from_bytes(payload[4:8], 'big')}"
        if counted:
            tally.messages_total += counted
            if tally.warm_at <= now < tally.end_at:
                tally.messages_in_window += counted
        if self.conn_unacked >= CONNECTION_WINDOW // 4:
            self.out.append(h2.window_update(0, self.conn_unacked))
            self.conn_unacked = 0
        self._flush()

    # -- calls ------------------------------------------------------------------------------------

    def call(
        self,
        path: str,
        body: bytes,
        metadata: Iterable[tuple[str, str]] = (),
        result: CallResult | None = None,
    ) -> asyncio.Future[CallResult]:
        """Start a call (request headers, then ``body`` with END_STREAM); its future resolves once
        the trailers (or a reset, or the connection's end) come, with ``result`` (filled in as the
        messages arrive) or a new :class:`CallResult`."""
        done: asyncio.Future[CallResult] = self.loop.create_future()
        result = result or CallResult()
        if self.transport is None:
            result.error = self.error or "connection closed"
            done.set_result(result)
            return done
        key = (path, tuple(metadata))
        head = self.heads.get(key)
        if head is None:
            fields = [
                (b":method", b"POST"),
                (b":scheme", b"http"),
                (b":path", path.encode()),
                (b":authority", self.authority),
                (b"content-type", b"application/grpc"),
                (b"te", b"trailers"),
                *((k.encode(), v.encode()) for k, v in key[1]),
            ]
            head = self.heads[key] = h2.static_block(fields)
        sid = self.next_sid
        self.next_sid += 2
        self.streams[sid] = _Stream(done, result)
        self.out.append(h2.header(len(head), h2.HEADERS, h2.END_HEADERS, sid) + head)
        self.out.append(h2.header(len(body), h2.DATA, h2.END_STREAM, sid) + body)
        self._flush()
        return done

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    async def closed(self, timeout: float = 5.0) -> None:
        """Close, and wait until the socket is gone (so that the target sees it before whatever the
        caller does next, such as signalling the target)."""
        self.close()
        await asyncio.wait({self.lost}, timeout=timeout)

    def _flush(self) -> None:
        if self.out:
            if self.transport is not None:
                self.transport.write(b"".join(self.out))
            self.out.clear()

    def _headers(self, sid: int, flags: int, block: bytes) -> None:
        headers = self.decoder.decode(block)  # every block, to keep the HPACK table in step
        if sid not in self.streams:
            return
        status = next((v for n, v in headers if n == b"grpc-status"), None)
        if status is not None or flags & h2.END_STREAM:
            code = next((v for n, v in headers if n == b":status"), None)
            error = None if status is not None else f"no grpc-status (HTTP status {code!r})"
            self._end(sid, status.decode() if status is not None else None, error)

    def _end(self, sid: int, status: str | None, error: str | None) -> None:
        stream = self.streams.pop(sid, None)
        if stream is None:
            return
        stream.result.status = status
        if status is not None and status != "0":
            error = f"grpc-status {status}"
        stream.result.error = error
        if not stream.done.done():
            stream.done.set_result(stream.result)


# -- workloads ------------------------------------------------------------------------------------


@dataclass
class _Errors:
    count: int = 0
    first: str | None = None

    def add(self, reason: str) -> None:
        self.count += 1
        self.first = self.first or reason


async def probe(host: str, port: int, timeout: float = 5.0) -> str | None:
    """One Echo call: None when it comes back intact, else what went wrong."""
    body = echo_request(16)
    try:
        client = await Client.connect(host, port, timeout=timeout)
    except (OSError, TimeoutError) as exc:
        return f"cannot connect: {type(exc).__name__}: {exc}"
    try:
        result = await asyncio.wait_for(client.call(ECHO, body), timeout)
    except TimeoutError:
        return f"no answer to an Echo call in {timeout:g} s"
    finally:
        await client.closed()
    if result.error:
        return result.error
    return None if result.messages == 1 else f"Echo answered {result.messages} messages"


async def stream(
    host: str, port: int, concurrency: int, duration: float, *, messages: int, warmup: float
) -> dict[str, Any]:
    """Closed loop on one connection: ``concurrency`` server-streaming Generate calls of ``messages``
    unpaced tokens each, a new call as soon as one ends. Messages are counted in the window after
    ``warmup``; the calls still open at its end are cut with the connection."""
    body = generate_request(messages)
    cpu0, wall0 = cpu_self(), time.perf_counter()
    tally = Tally(warm_at=wall0 + warmup, end_at=wall0 + warmup + duration)
    errors = _Errors()
    done = 0
    client = await Client.connect(host, port, tally)

    closing = False

    async def slot() -> None:
        nonlocal done
        while time.perf_counter() < tally.end_at and not closing:
            result = await client.call(GENERATE, body)
            if result.error:
                if not closing:
                    errors.add(result.error)
                    await asyncio.sleep(0.05)  # do not spin on a refusing target
                continue
            if result.messages != messages + 1:
                errors.add(f"{result.messages} messages, not {messages + 1}")
            done += 1

    tasks = [asyncio.ensure_future(slot()) for _ in range(concurrency)]
    await asyncio.sleep(warmup + duration)
    closing = True
    await client.closed()
    await asyncio.wait(tasks, timeout=10)
    wall = time.perf_counter() - wall0
    return {
        "client": "h2c",
        "concurrency": concurrency,
        "messages_per_call": messages + 1,
        "messages_per_s": tally.messages_in_window / duration,
        "messages_total": tally.messages_total,
        "calls_done": done,
        "errors": errors.count,
        "first_error": errors.first,
        "seconds": wall,
        "loadgen_core": (cpu_self() - cpu0) / wall,
    }


async def unary(
    host: str, port: int, connections: int, streams: int, duration: float, *, body_bytes: int, warmup: float
) -> dict[str, Any]:
    """Closed loop of Echo calls: ``streams`` at a time on each of ``connections`` (the fallback
    when h2load is absent, and the smoke run's). ``rate`` counts the calls in the window after
    ``warmup``; ``requests`` every call that came back whole (what the target's CPU is divided by)."""
    body = echo_request(body_bytes)
    cpu0, wall0 = cpu_self(), time.perf_counter()
    warm_at, end_at = wall0 + warmup, wall0 + warmup + duration
    errors = _Errors()
    latencies: list[float] = []
    done = 0
    clients = [await Client.connect(host, port) for _ in range(connections)]

    async def slot(client: Client) -> None:
        nonlocal done
        while (t0 := time.perf_counter()) < end_at:
            result = await client.call(ECHO, body)
            now = time.perf_counter()
            if result.error or result.messages != 1:
                errors.add(result.error or f"{result.messages} messages")
                await asyncio.sleep(0.05)
                continue
            done += 1
            if warm_at <= t0 and now < end_at:
                latencies.append(now - t0)

    await asyncio.gather(*(slot(c) for c in clients for _ in range(streams)))
    await asyncio.gather(*(client.closed() for client in clients))
    wall = time.perf_counter() - wall0
    pct = stats.percentiles(latencies)
    return {
        "client": "h2c",
        "requests": done,
        "rate": len(latencies) / duration,
        "lat_mean_ms": sum(latencies) / len(latencies) * 1000 if latencies else None,
        "lat_p50_ms": pct["p50"] * 1000,
        "lat_p99_ms": pct["p99"] * 1000,
        "errors": errors.count,
        "first_error": errors.first,
        "seconds": wall,
        "loadgen_core": (cpu_self() - cpu0) / wall,
    }


def h2load_available() -> bool:
    return shutil.which("h2load") is not None


_H2LOAD_FINISHED = re.compile(r"finished in [\d.]+\w*, ([\d.]+) req/s")
_H2LOAD_REQUESTS = re.compile(
    r"requests: (\d+) total, (\d+) started, (\d+) done, (\d+) succeeded, (\d+) failed, (\d+) errored, (\d+) timeout"
)
_H2LOAD_STATUS = re.compile(r"status codes: (\d+) 2xx, (\d+) 3xx, (\d+) 4xx, (\d+) 5xx")
_H2LOAD_LATENCY = re.compile(r"time for request:\s+([\d.]+)(us|ms|s)\s+([\d.]+)(us|ms|s)\s+([\d.]+)(us|ms|s)")
_UNIT_MS = {"us": 1e-3, "ms": 1.0, "s": 1000.0}


def parse_h2load(text: str) -> dict[str, Any]:
    """h2load's summary: the rate over the main duration, the outcome counts, latency min/max/mean."""
    finished, counts = _H2LOAD_FINISHED.search(text), _H2LOAD_REQUESTS.search(text)
    if finished is None or counts is None:
        raise ValueError("no h2load summary in its output")
    _total, _started, done, succeeded, failed, errored, timeout = (int(x) for x in counts.groups())
    out: dict[str, Any] = {
        "rate": float(finished.group(1)),
        "requests": succeeded,
        "requests_done": done,
        "errors": failed + errored + timeout,
    }
    status = _H2LOAD_STATUS.search(text)
    if status is not None:
        out["non_2xx"] = sum(int(x) for x in status.groups()[1:])
    latency = _H2LOAD_LATENCY.search(text)
    if latency is not None:
        values = latency.groups()
        out["lat_min_ms"] = float(values[0]) * _UNIT_MS[values[1]]
        out["lat_max_ms"] = float(values[2]) * _UNIT_MS[values[3]]
        out["lat_mean_ms"] = float(values[4]) * _UNIT_MS[values[5]]
    return out


def h2load(
    url: str,
    connections: int,
    streams: int,
    duration: float,
    *,
    body_bytes: int,
    cpus: set[int] | None = None,
) -> dict[str, Any]:
    """Unary Echo calls with h2load (one thread, h2c prior knowledge, pinned like this process):
    ``streams`` at a time on each of ``connections``, for ``duration`` s. No warm-up period, as with
    wrk: the target's CPU over the run is divided by every call it relayed."""
    with tempfile.NamedTemporaryFile("wb", suffix=".grpc", delete=False) as fh:
        fh.write(echo_request(body_bytes))
        body = fh.name
    cmd = [
        "h2load",
        "-t1",
        f"-c{connections}",
        f"-m{streams}",
        f"-D{max(1, round(duration))}",
        "-d",
        body,
        "-H",
        "content-type: application/grpc",
        "-H",
        "te: trailers",
        url + ECHO,
    ]
    try:
        proc, wall, cpu = run_tool(cmd, duration, cpus)
    finally:
        os.unlink(body)
    try:
        out = parse_h2load(proc.stdout)
    except ValueError:
        raise RuntimeError(f"h2load failed ({proc.returncode}): {proc.stderr.strip() or proc.stdout.strip()}") from None
    out["errors"] += out.get("non_2xx", 0)
    return {"client": "h2load", **out, "seconds": wall, "loadgen_core": cpu / wall}


async def hold(
    host: str,
    port: int,
    count: int,
    rss_kib: Callable[[], int],
    *,
    per_connection: int,
    interval_ms: int,
    settle: float = 0.5,
    timeout: float = 120.0,
) -> dict[str, Any]:
    """Open ``count`` Generate calls, ``per_connection`` to a connection, paced one message every
    ``interval_ms`` (so they stay open and idle); once each has its first message, the target's RSS
    growth per open call. Then every connection is closed (the calls cancelled)."""
    body = generate_request(1_000_000)
    metadata = ((INTERVAL_HEADER, str(interval_ms)),)
    cpu0, wall0 = cpu_self(), time.perf_counter()
    errors = _Errors()
    await asyncio.sleep(settle)
    base = rss_kib()
    t0 = time.perf_counter()
    clients: list[Client] = []
    calls: list[asyncio.Future[CallResult]] = []
    open_calls: list[CallResult] = []
    for start in range(0, count, per_connection):
        try:
            client = await Client.connect(host, port)
        except (OSError, TimeoutError) as exc:
            errors.add(f"cannot connect: {type(exc).__name__}: {exc}")
            break
        clients.append(client)
        for _ in range(min(per_connection, count - start)):
            open_calls.append(CallResult())
            calls.append(client.call(GENERATE, body, metadata, open_calls[-1]))
    while time.perf_counter() - t0 < timeout:
        opened = sum(1 for r in open_calls if r.messages)
        ended = sum(1 for c in calls if c.done())
        if opened + ended >= len(calls):
            break
        await asyncio.sleep(0.05)
    open_secs = time.perf_counter() - t0
    await asyncio.sleep(settle)
    rss = rss_kib()
    held = sum(1 for c, r in zip(calls, open_calls) if r.messages and not c.done())
    for call in calls:
        if call.done():
            errors.add(call.result().error or "a held call ended")
    await asyncio.gather(*(client.closed() for client in clients))
    return {
        "streams_asked": count,
        "streams_open": held,
        "connections": len(clients),
        "open_seconds": open_secs,
        "rss_base_kib": base,
        "rss_kib": rss,
        "kib_per_stream": (rss - base) / held if held else None,
        "errors": count - held,
        "first_error": errors.first,
        "loadgen_core": (cpu_self() - cpu0) / (time.perf_counter() - wall0),
    }
