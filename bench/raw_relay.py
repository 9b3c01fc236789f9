"""A prototype, not a product: an HTTP/1.1 relay on raw asyncio protocols (uvloop), to measure how
fast a Python proxy on this machine can be when it skips aiohttp's request/response objects.

Client bytes go to a pooled upstream connection with ``X-Forwarded-For``/``-Proto`` appended; the
response bytes are relayed unchanged (chunked framing is passed through, only scanned to find where
the message ends), so an SSE event costs one read and one write. It handles what the bench sends
(GET/POST with Content-Length or no body; responses with Content-Length or chunked) and nothing
else: no hop-by-hop filtering, no chunked request bodies, no errors as responses, no metrics, no
drain. Not in the default target set: ``python -m bench --targets direct,router,raw,nginx``.
Run: ``python -m bench.raw_relay LISTEN_PORT UPSTREAM_PORT``.
"""

from __future__ import annotations

import asyncio
import sys

import uvloop


class Pool:
    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.idle: list[Upstream] = []

    async def get(self) -> Upstream:
        while self.idle:
            up = self.idle.pop()
            if up.transport is not None and not up.transport.is_closing():
                return up
        loop = asyncio.get_running_loop()
        _, up = await loop.create_connection(lambda: Upstream(self), self.host, self.port)
        return up


class Upstream(asyncio.Protocol):
    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        self.transport = None
        self.client: Client | None = None
        self.head = bytearray()
        self.in_body = False
        self.left = 0  # content-length bytes left
        self.chunked = False
        self.cstate = 0
        self.cbuf = bytearray()

    def connection_made(self, t):
        self.transport = t

    def connection_lost(self, exc):
        self.transport = None
        if self.client is not None:
            self.client.upstream_lost()

    def start(self, client: Client) -> None:
        self.client = client
        self.head.clear()
        self.in_body = False

    def data_received(self, data: bytes) -> None:
        client = self.client
        if client is None:
            return
        client.transport.write(data)
        if not self.in_body:
            self.head += data
            end = self.head.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(self.head[:end]).lower()
            rest = bytes(self.head[end + 4 :])
            self.in_body = True
            self.chunked = b"transfer-encoding: chunked" in head
            if not self.chunked:
                i = head.find(b"content-length:")
                self.left = (
                    int(head[i + 15 : head.find(b"\r\n", i) if head.find(b"\r\n", i) > 0 else None]) if i >= 0 else 0
                )
            else:
                self.cstate = 0
                self.cbuf.clear()
            data = rest
        if self.chunked:
            done = self._scan_chunked(data)
        else:
            self.left -= len(data)
            done = self.left <= 0
        if done:
            self.client = None
            self.pool.idle.append(self)
            client.response_done()

    def _scan_chunked(self, data: bytes) -> bool:
        buf = self.cbuf
        buf += data
        while True:
            if self.cstate == 0:
                eol = buf.find(b"\r\n")
                if eol < 0:
                    return False
                size = int(bytes(buf[:eol]).split(b";")[0], 16)
                del buf[: eol + 2]
                if size == 0:
                    self.cstate = 2
                else:
                    self.left = size + 2
                    self.cstate = 1
            elif self.cstate == 1:
                take = min(self.left, len(buf))
                del buf[:take]
                self.left -= take
                if self.left:
                    return False
                self.cstate = 0
            else:  # trailers until empty line
                eol = buf.find(b"\r\n")
                if eol < 0:
                    return False
                del buf[: eol + 2]
                if eol == 0:
                    return True


class Client(asyncio.Protocol):
    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        self.transport = None
        self.buf = bytearray()
        self.busy = False
        self.up: Upstream | None = None
        self.body_left = 0

    def connection_made(self, t):
        self.transport = t
        self.peer = t.get_extra_info("peername")[0].encode()

    def connection_lost(self, exc):
        self.transport = None
        if self.up is not None and self.up.client is self and self.up.transport:
            self.up.transport.close()  # abandon the upstream request at once

    def data_received(self, data: bytes) -> None:
        if self.busy and self.body_left and self.up is not None:
            take = data[: self.body_left]
            self.body_left -= len(take)
            self.up.transport.write(take)
            data = data[len(take) :]
            if not data:
                return
        self.buf += data
        if not self.busy:
            self._next()

    def _next(self) -> None:
        end = self.buf.find(b"\r\n\r\n")
        if end < 0:
            return
        head = bytes(self.buf[:end])
        del self.buf[: end + 4]
        lower = head.lower()
        i = lower.find(b"\r\ncontent-length:")
        length = (
            int(lower[i + 17 : lower.find(b"\r\n", i + 2) if lower.find(b"\r\n", i + 2) > 0 else None]) if i >= 0 else 0
        )
        out = head + b"\r\nX-Forwarded-For: " + self.peer + b"\r\nX-Forwarded-Proto: http\r\n\r\n"
        body = bytes(self.buf[:length])
        del self.buf[:length]
        self.body_left = length - len(body)
        self.busy = True
        self.sending = asyncio.ensure_future(self._send(out + body))  # kept: a task nobody holds can vanish

    async def _send(self, payload: bytes) -> None:
        up = await self.pool.get()
        if self.transport is None:
            self.pool.idle.append(up)
            return
        self.up = up
        up.start(self)
        up.transport.write(payload)

    def response_done(self) -> None:
        self.busy = False
        self.up = None
        if self.buf and self.transport is not None:
            self._next()

    def upstream_lost(self) -> None:
        if self.transport is not None:
            self.transport.close()


async def main(listen: int, upstream: int) -> None:
    loop = asyncio.get_running_loop()
    pool = Pool("127.0.0.1", upstream)
    server = await loop.create_server(lambda: Client(pool), "127.0.0.1", listen, backlog=4096)
    await asyncio.Event().wait()
    server.close()


if __name__ == "__main__":
    uvloop.run(main(int(sys.argv[1]), int(sys.argv[2])))
