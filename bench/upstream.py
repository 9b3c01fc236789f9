"""The bench upstream: a stand-in model server on a raw asyncio protocol (uvloop), so it is never the
bottleneck of a proxy measurement.

Kept apart from ``drain-router fake-model`` on purpose: the fake model is an aiohttp application
(counters, overrides, a vLLM-like shutdown) whose own per-request cost (~50 µs in aiohttp's server
alone) would be measured along with the proxy; this one writes prebuilt bytes.

Routes (HTTP/1.1, keep-alive, request bodies by Content-Length or chunked):

- ``GET /small``: 200 with a 200-byte JSON body.
- ``GET|POST /v1/completions?chunks=N&interval_ms=MS&hold=0|1``: an OpenAI-style SSE stream of ``N``
  ``data: {...}`` events and a final ``data: [DONE]``, one HTTP chunk (one ``write``) per event. The
  headers and the first event go out at once, the rest every ``MS`` ms (0: back to back). ``hold=1``
  sends the headers and the first event, then holds the stream open until the client leaves.
- ``POST /upload``: reads and discards the body, answers ``{"bytes": n}``.
- ``GET /v1/realtime`` with ``Upgrade: websocket`` and ``Connection: upgrade``: 101, then a WebSocket echo: every data frame
  from the client comes back as one unmasked frame with the same payload, pings get pongs, a Close
  is answered with a Close and the connection closes. Idle sessions cost nothing but the socket.
- anything else: 404.

Run: ``python -m bench.upstream --port 8000``.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import os
import signal
from urllib.parse import parse_qs

SMALL_BODY = (b'{"object":"model","id":"bench-small","owned_by":"bench","padding":"' + b"x" * 200)[:198] + b'"}'
assert len(SMALL_BODY) == 200

#: One completion event, about the size of an OpenAI streaming chunk with one token.
EVENT = (
    b'data: {"id":"cmpl-bench","object":"text_completion","created":1700000000,'
    b'"model":"bench","choices":[{"index":0,"text":" token","finish_reason":null}]}\n\n'
)
EVENT_CHUNK = b"%x\r\n%s\r\n" % (len(EVENT), EVENT)
DONE = b"data: [DONE]\n\n"
DONE_CHUNK = b"%x\r\n%s\r\n0\r\n\r\n" % (len(DONE), DONE)
SSE_HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n"
)
SMALL_RESPONSE = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (
    len(SMALL_BODY),
    SMALL_BODY,
)
NOT_FOUND = b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n"
MAX_HEADER_BYTES = 64 * 1024
WS_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
WS_SWITCH = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: "
OP_CLOSE, OP_PING, OP_PONG = 0x8, 0x9, 0xA


def ws_frame(first: int, payload: bytes) -> bytes:
    """One unmasked (server) frame: ``first`` is the FIN bit and the opcode."""
    n = len(payload)
    if n < 126:
        return bytes((first, n)) + payload
    if n < 65536:
        return bytes((first, 126)) + n.to_bytes(2, "big") + payload
    return bytes((first, 127)) + n.to_bytes(8, "big") + payload


def unmask(payload: bytes, mask: bytes) -> bytes:
    n = len(payload)
    key = (mask * (n // 4 + 1))[:n]
    return (int.from_bytes(payload, "little") ^ int.from_bytes(key, "little")).to_bytes(n, "little")


class _Request:
    __slots__ = ("chunked", "close", "length", "method", "path", "query", "ws_key")

    def __init__(self, method: str, target: str, headers: dict[bytes, bytes], version: bytes) -> None:
        self.method = method
        self.path, _, self.query = target.partition("?")
        conn = headers.get(b"connection", b"").lower()
        self.close = conn == b"close" or (version == b"HTTP/1.0" and conn != b"keep-alive")
        self.chunked = b"chunked" in headers.get(b"transfer-encoding", b"").lower()
        self.length = 0 if self.chunked else int(headers.get(b"content-length", b"0"))
        tokens = {t.strip() for t in conn.split(b",")}
        upgrade = headers.get(b"upgrade", b"").lower() == b"websocket" and b"upgrade" in tokens
        self.ws_key = headers.get(b"sec-websocket-key") if upgrade else None


class UpstreamProtocol(asyncio.Protocol):
    """One client connection: parse a request, consume its body, answer, repeat."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.req: _Request | None = None
        self.body_left = 0  # Content-Length bytes still to consume
        self.chunk_state = 0  # chunked body: 0 size line, 1 data, 2 CRLF after data, 3 trailers
        self.body_bytes = 0
        self.busy = False  # a streamed response is still being written
        self.timer: asyncio.TimerHandle | None = None
        self.ws = False  # switched to WebSocket: the buffer holds frames

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is not an asyncio.Transport subclass

    def connection_lost(self, exc: Exception | None) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.transport = None

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if self.ws:
            self._ws_advance()
        else:
            self._advance()

    # -- request parsing --------------------------------------------------------------------------

    def _advance(self) -> None:
        while self.transport is not None and not self.busy:
            if self.req is None:
                end = self.buf.find(b"\r\n\r\n")
                if end < 0:
                    if len(self.buf) > MAX_HEADER_BYTES:
                        self.transport.close()
                    return
                head = bytes(self.buf[:end]).split(b"\r\n")
                del self.buf[: end + 4]
                method, target, version = head[0].split(b" ", 2)
                headers = {}
                for line in head[1:]:
                    name, _, value = line.partition(b":")
                    headers[name.strip().lower()] = value.strip()
                self.req = _Request(method.decode(), target.decode(), headers, version)
                self.body_left = self.req.length
                self.chunk_state = 0
                self.body_bytes = 0
            if not self._consume_body():
                return
            req, self.req = self.req, None
            self._respond(req)
            if self.ws:
                self._ws_advance()
                return

    def _consume_body(self) -> bool:
        """Eat body bytes from the buffer; True once the whole body is in."""
        assert self.req is not None
        if not self.req.chunked:
            take = min(self.body_left, len(self.buf))
            if take:
                del self.buf[:take]
                self.body_left -= take
                self.body_bytes += take
            return self.body_left == 0
        while True:
            if self.chunk_state == 0:  # size line
                eol = self.buf.find(b"\r\n")
                if eol < 0:
                    return False
                size = int(bytes(self.buf[:eol]).split(b";")[0], 16)
                del self.buf[: eol + 2]
                if size == 0:
                    self.chunk_state = 3
                else:
                    self.body_left = size
                    self.chunk_state = 1
            elif self.chunk_state == 1:  # data
                take = min(self.body_left, len(self.buf))
                if take:
                    del self.buf[:take]
                    self.body_left -= take
                    self.body_bytes += take
                if self.body_left:
                    return False
                self.chunk_state = 2
            elif self.chunk_state == 2:  # CRLF after data
                if len(self.buf) < 2:
                    return False
                del self.buf[:2]
                self.chunk_state = 0
            else:  # trailers until an empty line
                eol = self.buf.find(b"\r\n")
                if eol < 0:
                    return False
                del self.buf[: eol + 2]
                if eol == 0:
                    return True

    # -- responses --------------------------------------------------------------------------------

    def _respond(self, req: _Request) -> None:
        transport = self.transport
        assert transport is not None
        if req.path == "/small":
            transport.write(SMALL_RESPONSE)
        elif req.path == "/v1/realtime" and req.ws_key is not None:
            accept = base64.b64encode(hashlib.sha1(req.ws_key + WS_GUID).digest())
            transport.write(WS_SWITCH + accept + b"\r\n\r\n")
            self.ws = True
            return
        elif req.path == "/v1/completions":
            query = parse_qs(req.query)
            chunks = int(query.get("chunks", ["64"])[0])
            interval = float(query.get("interval_ms", ["0"])[0]) / 1000.0
            hold = query.get("hold", ["0"])[0] == "1"
            self._stream(req, chunks, interval, hold)
            return
        elif req.path == "/upload":
            body = b'{"bytes":%d}' % self.body_bytes
            transport.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
            )
        else:
            transport.write(NOT_FOUND)
        if req.close:
            transport.close()

    # -- WebSocket echo -----------------------------------------------------------------------------

    def _ws_advance(self) -> None:
        buf = self.buf
        while self.transport is not None and len(buf) >= 2:
            first, second = buf[0], buf[1]
            size, pos = second & 0x7F, 2
            if size == 126:
                if len(buf) < 4:
                    return
                size, pos = int.from_bytes(buf[2:4], "big"), 4
            elif size == 127:
                if len(buf) < 10:
                    return
                size, pos = int.from_bytes(buf[2:10], "big"), 10
            mask = b""
            if second & 0x80:
                if len(buf) < pos + 4:
                    return
                mask, pos = bytes(buf[pos : pos + 4]), pos + 4
            if len(buf) < pos + size:
                return
            payload = bytes(buf[pos : pos + size])
            del buf[: pos + size]
            if mask:
                payload = unmask(payload, mask)
            opcode = first & 0x0F
            if opcode == OP_CLOSE:
                self.transport.write(ws_frame(0x80 | OP_CLOSE, payload[:2]))
                self.transport.close()
                return
            if opcode == OP_PING:
                self.transport.write(ws_frame(0x80 | OP_PONG, payload))
            elif opcode != OP_PONG:
                self.transport.write(ws_frame(first & 0x8F, payload))  # the data frame, echoed

    def _stream(self, req: _Request, chunks: int, interval: float, hold: bool) -> None:
        transport = self.transport
        assert transport is not None
        self.busy = True
        transport.write(SSE_HEAD)
        transport.write(EVENT_CHUNK)
        if hold:
            return  # until the client goes away
        if interval <= 0 or chunks <= 1:
            for _ in range(chunks - 1):
                transport.write(EVENT_CHUNK)
            self._finish(req, resume=False)  # we are inside _advance, which goes on by itself
            return
        loop = asyncio.get_running_loop()
        start = loop.time()
        sent = 1

        def tick() -> None:
            nonlocal sent
            self.timer = None
            if self.transport is None:
                return
            self.transport.write(EVENT_CHUNK)
            sent += 1
            if sent >= chunks:
                self._finish(req, resume=True)
            else:
                self.timer = loop.call_at(start + sent * interval, tick)

        self.timer = loop.call_at(start + interval, tick)

    def _finish(self, req: _Request, resume: bool) -> None:
        assert self.transport is not None
        self.transport.write(DONE_CHUNK)
        self.busy = False
        if req.close:
            self.transport.close()
        elif resume and self.buf:
            self._advance()


async def serve(host: str, port: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(UpstreamProtocol, host, port, backlog=4096, reuse_address=True)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"bench upstream listening on {host}:{port} pid {os.getpid()}", flush=True)
    await stop.wait()
    server.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.upstream", description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    import uvloop

    uvloop.run(serve(args.host, args.port))


if __name__ == "__main__":
    main()
