"""The suite's instruments: a raw-socket upstream that reads what the router sends with h11 as a
server, an h11 client that reads what the router answers, and waits on the router's admin endpoints.

h11 is the oracle: whether bytes are valid HTTP/1.1, where a message ends and what its body is, are
its decisions, not the router's. A few rules h11 tolerates but RFC 9112/9110 forbid a sender are
checked on top (:func:`framing_faults`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import threading
import time
from collections.abc import AsyncIterator, Coroutine, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

import h11
from hypothesis import HealthCheck, Phase, settings

from tests.blackbox import requests_total
from tests.process import RouterProcess

#: Hypothesis against real processes: a fixed derandomized run, no shrinking (each failing example
#: costs its timeouts again), stop at the first failure (one poisoned upstream connection would
#: make later examples fail for its sake).
QUICK = settings(
    deadline=None,
    derandomize=True,
    database=None,
    phases=(Phase.explicit, Phase.generate),
    report_multiple_bugs=False,
    suppress_health_check=list(HealthCheck),
)

T = TypeVar("T")

#: h11's limit on an incomplete head is 16 KiB by default; the oracle must be able to read any head
#: the router could legitimately forward or answer, so it reads up to this much.
ORACLE_HEAD_BYTES = 4 * 1024 * 1024
#: Requests carry their identity in this header; the upstream's answers echo it.
ID = b"x-req-id"
ECHO_ID = b"x-echo-id"
ECHO_SHA = b"x-body-sha256"
ECHO_LEN = b"x-body-length"

_IDS = itertools.count(1)


def new_id(prefix: str = "r") -> str:
    """A request id unique in this test run, always as long: a generated case's size must not
    change when hypothesis replays it with a later id (r9 -> r10), or its draws differ and
    hypothesis reports the strategy flaky."""
    return f"{prefix}{next(_IDS):08d}"


def sha(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


# -- the upstream ------------------------------------------------------------------------------------


@dataclass
class Seen:
    """One request as the upstream's h11 parsed it."""

    conn: int
    method: bytes
    target: bytes
    version: bytes
    headers: list[tuple[bytes, bytes]]
    """Names lowercased by h11, in order, repeats kept."""
    body: bytes

    def values(self, name: bytes) -> list[bytes]:
        return [v for k, v in self.headers if k == name]

    @property
    def id(self) -> str | None:
        found = self.values(ID)
        return found[0].decode("latin-1") if found else None


@dataclass
class Script:
    """How the upstream answers one request: ``pieces`` written one after another (each drained, so
    they tend to arrive in separate reads; an :class:`asyncio.Event` among them is waited for, a
    callable is called: a test's gates), then ``then``: ``keep`` (read the next request on this
    connection), ``close`` (close it), ``hold`` (send nothing more; wait for the router to close)."""

    pieces: list[Any]
    then: str = "keep"


def echo(seen: Seen) -> bytes:
    """The default answer: 200 naming the request and its body (id, sha256, length)."""
    rid = (seen.id or "-").encode()
    body = b"echo " + rid
    head = (
        b"HTTP/1.1 200 OK\r\nX-Echo-Id: %s\r\nX-Body-Sha256: %s\r\nX-Body-Length: %d\r\nContent-Length: %d\r\n\r\n"
        % (rid, sha(seen.body).encode(), len(seen.body), len(body))
    )
    return head if seen.method == b"HEAD" else head + body


@dataclass
class Upstream:
    """A model server on raw sockets. Every request is parsed by a fresh h11 server connection (fed
    what the previous one left), recorded in :attr:`seen`, and answered by the :class:`Script` named
    by its id in :attr:`scripts`, else by :func:`echo`. What h11 refuses is recorded in
    :attr:`violations` and the connection closed."""

    port: int = 0
    accepted: int = 0
    seen: list[Seen] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    scripts: dict[str, Script] = field(default_factory=dict)
    closed_by_router: set[int] = field(default_factory=set)
    """Connections whose end the router chose (EOF or reset read here)."""
    _writers: set[asyncio.StreamWriter] = field(default_factory=set)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def ids(self) -> list[str | None]:
        return [s.id for s in self.seen]

    def by_id(self, rid: str) -> list[Seen]:
        return [s for s in self.seen if s.id == rid]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        conn = self.accepted
        self._writers.add(writer)
        leftover = b""
        try:
            while True:
                parser = h11.Connection(h11.SERVER, max_incomplete_event_size=ORACLE_HEAD_BYTES)
                if leftover:
                    parser.receive_data(leftover)  # (b"" would mean EOF to h11)
                request: h11.Request | None = None
                body = bytearray()
                while True:
                    event = parser.next_event()
                    if event is h11.NEED_DATA:
                        try:
                            data = await reader.read(65536)
                        except ConnectionError:
                            data = b""
                        if not data:
                            self.closed_by_router.add(conn)
                        parser.receive_data(data)
                    elif isinstance(event, h11.Request):
                        request = event
                    elif isinstance(event, h11.Data):
                        body += event.data
                    elif isinstance(event, h11.EndOfMessage):
                        break
                    elif isinstance(event, h11.ConnectionClosed):
                        return
                assert request is not None
                leftover = parser.trailing_data[0]
                seen = Seen(
                    conn, request.method, request.target, request.http_version, list(request.headers), bytes(body)
                )
                self.seen.append(seen)
                script = self.scripts.get(seen.id or "") or Script([echo(seen)])
                for piece in script.pieces:
                    if isinstance(piece, asyncio.Event):
                        await piece.wait()
                    elif callable(piece):
                        piece()
                    else:
                        writer.write(piece)
                        await writer.drain()
                if script.then == "close":
                    return
                if script.then == "hold":
                    try:
                        while await reader.read(65536):
                            pass
                    except ConnectionError:
                        pass
                    self.closed_by_router.add(conn)
                    return
        except h11.RemoteProtocolError as exc:
            self.violations.append(f"upstream connection {conn}: h11 refused what the router sent: {exc}")
        except ConnectionError:
            self.closed_by_router.add(conn)
        finally:
            self._writers.discard(writer)
            writer.close()


@contextlib.asynccontextmanager
async def upstream() -> AsyncIterator[Upstream]:
    up = Upstream()
    server = await asyncio.start_server(up._serve, "127.0.0.1", 0)
    up.port = server.sockets[0].getsockname()[1]
    try:
        yield up
    finally:
        server.close()
        for writer in list(up._writers):
            writer.transport.abort()
        await server.wait_closed()


# -- the client --------------------------------------------------------------------------------------


@dataclass
class Answer:
    """One final response as h11 read it, with the interim responses before it."""

    status: int
    version: bytes
    headers: list[tuple[bytes, bytes]]
    body: bytes
    interim: list[int]
    interim_headers: list[list[tuple[bytes, bytes]]]

    def values(self, name: bytes) -> list[bytes]:
        return [v for k, v in self.headers if k == name]

    def header(self, name: bytes) -> bytes | None:
        found = self.values(name)
        return found[0] if found else None

    @property
    def echo_id(self) -> str | None:
        found = self.header(ECHO_ID)
        return found.decode("latin-1") if found is not None else None


class NotHttp(AssertionError):
    """What the router wrote is not valid HTTP/1.1 by h11."""


class Client:
    """A client connection to the router whose answers h11 parses. The requests are written as raw
    bytes (:meth:`send`); h11 is told only the method (and ``Connection: close``) of each, which is
    what it needs to find a response's end."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.h11 = h11.Connection(h11.CLIENT, max_incomplete_event_size=ORACLE_HEAD_BYTES)
        self.reset = False
        """The router reset the connection (ECONNRESET on a read)."""
        self.write_error: BaseException | None = None
        self.eof = False
        self.raw = bytearray()
        """Every byte read, for failure messages."""

    @classmethod
    async def open(cls, port: int) -> Client:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=ORACLE_HEAD_BYTES)
        return cls(reader, writer)

    async def send(self, *pieces: bytes) -> None:
        """Write ``pieces`` one after another, each drained (a write the router refuses is recorded
        in :attr:`write_error`, not raised: the answer may still be there to read)."""
        for piece in pieces:
            if self.write_error is not None:
                return
            try:
                self.writer.write(piece)
                await self.writer.drain()
            except ConnectionError as exc:
                self.write_error = exc

    async def _fill(self, deadline: float) -> None:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError
        try:
            data = await asyncio.wait_for(self.reader.read(65536), remaining)
        except ConnectionResetError:
            self.reset = True
            data = b""
        self.raw += data
        self.eof = self.eof or not data
        self.h11.receive_data(data)

    def _tail(self) -> str:
        return repr(bytes(self.raw[-600:]))

    async def response(self, method: str = "GET", *, close: bool = False, timeout: float = 5.0) -> Answer | None:
        """The next final response (for a request with this method), or None if the connection
        ended cleanly before one began. Raises :class:`NotHttp` if h11 refuses the bytes, and
        ``TimeoutError`` if no whole response came within ``timeout``."""
        conn = self.h11
        if conn.our_state is h11.DONE and conn.their_state is h11.DONE:
            conn.start_next_cycle()
        if conn.our_state is not h11.IDLE:
            return None  # the previous response ended the connection
        headers = [("Host", "oracle")] + ([("Connection", "close")] if close else [])
        conn.send(h11.Request(method=method, target="/", headers=headers))
        conn.send(h11.EndOfMessage())
        deadline = time.monotonic() + timeout
        answer: Answer | None = None
        interim: list[int] = []
        interim_headers: list[list[tuple[bytes, bytes]]] = []
        body = bytearray()
        start = len(self.raw)
        try:
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    await self._fill(deadline)
                elif isinstance(event, h11.InformationalResponse):
                    interim.append(event.status_code)
                    interim_headers.append(list(event.headers))
                elif isinstance(event, h11.Response):
                    answer = Answer(
                        event.status_code, event.http_version, list(event.headers), b"", interim, interim_headers
                    )
                elif isinstance(event, h11.Data):
                    body += event.data
                elif isinstance(event, h11.EndOfMessage):
                    assert answer is not None
                    answer.body = bytes(body)
                    return answer
                elif isinstance(event, h11.ConnectionClosed):
                    return None
        except h11.RemoteProtocolError as exc:
            if self.eof and answer is None and not interim and len(self.raw) == start:
                return None  # closed between responses: h11 calls that the server's error, not us
            raise NotHttp(f"h11 refused the router's bytes: {exc}; last bytes read: {self._tail()}") from None
        except TimeoutError:
            raise TimeoutError(f"no whole response within {timeout}s; last bytes read: {self._tail()}") from None

    async def rest(self, timeout: float = 5.0) -> bytes:
        """Read until the router closes the connection: what came after the last response parsed.
        Fails if the connection is still open at ``timeout``."""
        extra = bytearray(self.h11.trailing_data[0])
        if self.h11.trailing_data[1]:
            return bytes(extra)
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"the router did not close the connection within {timeout}s")
            try:
                data = await asyncio.wait_for(self.reader.read(65536), remaining)
            except TimeoutError:
                continue
            except ConnectionResetError:
                self.reset = True
                return bytes(extra)
            if not data:
                return bytes(extra)
            extra += data

    def close(self) -> None:
        self.writer.close()


def framing_faults(answer: Answer, *, method: str = "GET", http10: bool = False) -> list[str]:
    """Sender rules h11 does not enforce on what it reads (RFC 9112 §6.1-6.3, RFC 9110 §8.6, §15.2)."""
    faults = []
    te = answer.values(b"transfer-encoding")
    cl = answer.values(b"content-length")
    if te and cl:
        faults.append("both Transfer-Encoding and Content-Length")
    if len(set(cl)) > 1:
        faults.append(f"conflicting Content-Length {cl}")
    if (answer.status == 204 or answer.status < 200) and (te or cl):
        faults.append(f"{answer.status} with framing headers")
    for status, headers in zip(answer.interim, answer.interim_headers, strict=True):
        framing = [name for name, _ in headers if name in (b"content-length", b"transfer-encoding")]
        if framing:
            faults.append(f"interim {status} with framing headers {framing}")
    if http10 and te:
        faults.append("Transfer-Encoding to an HTTP/1.0 client")
    if http10 and answer.interim:
        faults.append(f"interim responses {answer.interim} to an HTTP/1.0 client")
    connection = b",".join(answer.values(b"connection")).lower()
    named = {t.strip() for t in connection.split(b",") if t.strip()}
    if named & {b"content-length", b"transfer-encoding", b"host"}:
        faults.append(f"Connection names a framing header: {connection!r}")
    return faults


# -- the router's admin endpoints -------------------------------------------------------------------


def delta(before: dict[tuple[str, str], float], after: dict[tuple[str, str], float]) -> dict[tuple[str, str], float]:
    """What ``requests_total`` counted between two scrapes, by (code, outcome)."""
    out = {key: after[key] - before.get(key, 0.0) for key in after}
    return {key: value for key, value in out.items() if value}


async def counted(admin_port: int) -> dict[tuple[str, str], float]:
    return await requests_total(admin_port)


# -- a router and an upstream on a loop in a thread (for hypothesis, whose tests are sync) -----------


class World:
    """An event loop in a daemon thread holding the upstream; the router as a real process in front
    of it. Tests run coroutines there with :meth:`run`."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.up: Upstream
        self.router: RouterProcess

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 60.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    @property
    def port(self) -> int:
        assert self.router.port is not None
        return self.router.port

    @property
    def admin_port(self) -> int:
        assert self.router.admin_port is not None
        return self.router.admin_port


@contextlib.contextmanager
def world(*router_args: str) -> Iterator[World]:
    w = World()
    stack = contextlib.AsyncExitStack()

    async def setup() -> None:
        w.up = await stack.enter_async_context(upstream())
        w.router = await RouterProcess.start("--upstream", w.up.url, "--shutdown-drain-secs", "0", *router_args)
        await w.router.wait_event("startup.listening")

    try:
        w.run(setup())
        yield w
    finally:

        async def teardown() -> None:
            if hasattr(w, "router"):
                await w.router.kill()
            await stack.aclose()

        w.run(teardown())
        w.loop.call_soon_threadsafe(w.loop.stop)
        w.thread.join(5)
        w.loop.close()
