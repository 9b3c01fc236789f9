"""Helpers for black-box tests of a real ``drain-router serve`` process over raw sockets."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import aiohttp
import psutil
from prometheus_client.parser import text_string_to_metric_families

from drain_router_dev.process import wait_until


def _complete(answer: bytes) -> bool:
    """One whole response with a Content-Length has arrived."""
    head, sep, body = answer.partition(b"\r\n\r\n")
    if not sep:
        return False
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return len(body) >= int(value)
    return False


async def raw_exchange(port: int, data: bytes, *, timeout: float = 3.0, whole: bool = False) -> tuple[bytes, bool]:
    """Send ``data`` on a new connection; return what came back and whether the router closed the
    connection (False: still open at ``timeout``). ``whole``: return as soon as one response with a
    Content-Length is complete (then ``closed`` says only whether the close came with it)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    out = b""
    closed = False
    try:
        while True:
            chunk = await asyncio.wait_for(reader.read(65536), timeout)
            if not chunk:
                closed = True
                break
            out += chunk
            if whole and _complete(out):
                break
    except TimeoutError:
        pass
    except ConnectionResetError:
        closed = True
    finally:
        writer.close()
    return out, closed


def status_of(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/") else 0


def reset(writer: asyncio.StreamWriter) -> None:
    """Close with an RST (SO_LINGER 0), as a client that crashes or times out hard does."""
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


async def requests_total(admin_port: int) -> dict[tuple[str, str], float]:
    """``drain_router_requests_total`` by (code, outcome), scraped from /metrics."""
    async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{admin_port}/metrics") as resp:
        text = await resp.text()
    out: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(text):
        if family.name == "drain_router_requests":
            for sample in family.samples:
                if sample.name == "drain_router_requests_total":
                    out[(sample.labels["code"], sample.labels["outcome"])] = sample.value
    return out


async def metric_samples(admin_port: int, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """Samples of ``name`` from /metrics, by their labels."""
    async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{admin_port}/metrics") as resp:
        text = await resp.text()
    out: dict[tuple[tuple[str, str], ...], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                out[tuple(sorted(sample.labels.items()))] = sample.value
    return out


class RawClient:
    """One raw connection with one request on it, closed at the end of the test (:meth:`close_all`,
    from an autouse fixture), whatever happened. Subclasses write the request (``send``)."""

    opened: ClassVar[list[RawClient]] = []

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        RawClient.opened.append(self)

    async def answer(self, timeout: float = 10.0) -> tuple[int, dict[str, str], bytes]:
        """The status, the headers (lowercase names) and the body of the one response."""
        head = await asyncio.wait_for(self.reader.readuntil(b"\r\n\r\n"), timeout)
        lines = head.decode("latin-1").split("\r\n")
        headers = {}
        for line in lines[1:]:
            if ":" in line:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
        body = await asyncio.wait_for(self.reader.readexactly(int(headers.get("content-length", "0"))), timeout)
        return status_of(head), headers, body

    async def closed(self, timeout: float = 5.0) -> bool:
        return await asyncio.wait_for(self.reader.read(1), timeout) == b""

    def close(self) -> None:
        self.writer.close()

    @staticmethod
    async def close_all() -> None:
        while RawClient.opened:
            client = RawClient.opened.pop()
            client.close()
            with contextlib.suppress(Exception):
                await client.writer.wait_closed()


async def inflight(admin_port: int) -> dict[str, object]:
    async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{admin_port}/admin/inflight") as resp:
        return await resp.json()


async def wait_idle(admin_port: int, timeout: float = 5.0) -> None:
    """Until ``/admin/inflight`` reads 0; the timeout names the count last read."""

    async def count() -> object:
        return (await inflight(admin_port))["inflight"]

    await wait_until(count, timeout, "in-flight 0", until=lambda now: now == 0)


async def settled(sample: Callable[[], int], *, settle: float, timeout: float, what: str, slack: int = 0) -> int:
    """``sample()`` once it has grown by no more than ``slack`` for ``settle`` s in a row: a figure that
    grows in bursts (a process's memory, bytes accepted until back-pressure holds them)."""
    last, since = sample(), time.monotonic()

    def steady(now: int) -> bool:
        nonlocal last, since
        if now > last + slack:
            last, since = now, time.monotonic()
        return time.monotonic() - since >= settle

    return await wait_until(sample, timeout, f"{what} to settle for {settle:g}s", until=steady)


async def settled_rss(pid: int, settle: float = 1.0, timeout: float = 10.0) -> int:
    """The process's RSS once it has stopped growing (by more than 64 KiB) for ``settle`` s; after
    ``timeout`` s, as it is then."""
    process = psutil.Process(pid)

    def rss() -> int:
        return int(process.memory_info().rss)

    with contextlib.suppress(TimeoutError):
        await settled(rss, settle=settle, timeout=timeout, what="the RSS", slack=64 * 1024)
    return rss()


def by_outcome(totals: dict[tuple[str, str], float]) -> dict[str, float]:
    out: dict[str, float] = {}
    for (_, outcome), value in totals.items():
        out[outcome] = out.get(outcome, 0) + value
    return out


def outcomes_in(registry: Any) -> dict[str, float]:
    """``requests_total`` of an in-process router's registry, summed by outcome (as :func:`by_outcome`)."""
    return by_outcome(
        {
            (s.labels["code"], s.labels["outcome"]): s.value
            for m in registry.collect()
            if m.name == "drain_router_requests"
            for s in m.samples
            if s.name.endswith("_total")
        }
    )


class Canary:
    """A listener no request may ever make the router reach; counts the connections it gets."""

    def __init__(self) -> None:
        self.connections = 0
        self.port = 0

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\ncanary")
        writer.close()


@contextlib.asynccontextmanager
async def canary() -> AsyncIterator[Canary]:
    c = Canary()
    server = await asyncio.start_server(c._handle, "127.0.0.1", 0)
    c.port = server.sockets[0].getsockname()[1]
    try:
        yield c
    finally:
        server.close()
        await server.wait_closed()


@dataclass
class Response:
    """One response as a client reads it off the wire."""

    version: bytes
    status: int
    headers: list[tuple[bytes, bytes]]
    """Names lowercased, in order, repeats kept."""
    body: bytes
    framing: str
    """How its body was delimited: ``length``, ``chunked``, ``close`` or ``none`` (HEAD, 1xx, 204, 304)."""
    trailers: list[tuple[bytes, bytes]] = field(default_factory=list)

    def header(self, name: bytes) -> bytes | None:
        for key, value in self.headers:
            if key == name.lower():
                return value
        return None

    def closes(self) -> bool:
        """The response says the connection ends after it."""
        tokens = b",".join(v for k, v in self.headers if k == b"connection").lower()
        if self.version == b"HTTP/1.0":
            return b"keep-alive" not in tokens or self.framing == "close"
        return b"close" in [t.strip() for t in tokens.split(b",")] or self.framing == "close"


def _fields(lines: list[bytes]) -> list[tuple[bytes, bytes]]:
    out = []
    for line in lines:
        name, _, value = line.partition(b":")
        out.append((name.strip().lower(), value.strip()))
    return out


async def read_response(reader: asyncio.StreamReader, *, method: str = "GET", timeout: float = 5.0) -> Response:
    """Read one response (an interim 1xx is returned as one, with no body), framed as its head says;
    fails with ``TimeoutError`` if it has not arrived whole within ``timeout`` seconds."""
    return await asyncio.wait_for(_read_response(reader, method), timeout)


async def _read_response(reader: asyncio.StreamReader, method: str) -> Response:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head[:-4].split(b"\r\n")
    version, status, _ = (lines[0] + b" ").split(b" ", 2)
    code = int(status)
    headers = _fields(lines[1:])
    response = Response(version=version, status=code, headers=headers, body=b"", framing="none")
    if code < 200 or code in (204, 304) or method == "HEAD":
        return response
    te = b",".join(v for k, v in headers if k == b"transfer-encoding").lower()
    if te:
        assert te.split(b",")[-1].strip() == b"chunked", te
        response.framing = "chunked"
        body = bytearray()
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0].strip(), 16)
            if size == 0:
                trailer_lines = []
                while (line := await reader.readuntil(b"\r\n")) != b"\r\n":
                    trailer_lines.append(line[:-2])
                response.trailers = _fields(trailer_lines)
                break
            body += await reader.readexactly(size)
            assert await reader.readexactly(2) == b"\r\n", "a chunk's data ends with CRLF"
        response.body = bytes(body)
        return response
    length = response.header(b"content-length")
    if length is not None:
        response.framing = "length"
        response.body = await reader.readexactly(int(length))
        return response
    response.framing = "close"
    response.body = await reader.read()  # until the connection closes
    return response


async def closed_within(reader: asyncio.StreamReader, timeout: float) -> bool:
    """The peer closed the connection (EOF or reset) within ``timeout`` seconds, with nothing more sent."""
    try:
        return await asyncio.wait_for(reader.read(65536), timeout) == b""
    except TimeoutError:
        return False
    except ConnectionError:
        return True
