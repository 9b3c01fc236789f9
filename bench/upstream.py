"""The bench upstream: a stand-in model server on a raw asyncio protocol (uvloop), so it is never the
bottleneck of a proxy measurement.

Kept apart from ``drain-router-dev fake-model`` on purpose: the fake model is an aiohttp application
(counters, overrides, a vLLM-like shutdown) whose own per-request cost (~50 µs in aiohttp's server
alone) would be measured along with the proxy; this one writes prebuilt bytes.

Routes (HTTP/1.1, keep-alive, request bodies by Content-Length or chunked):

- ``GET /small``: 200 with a 200-byte JSON body.
- ``GET|POST /v1/completions?chunks=N&interval_ms=MS&hold=0|1``: an OpenAI-style SSE stream of ``N``
  ``data: {...}`` events and a final ``data: [DONE]``, one HTTP chunk (one ``write``) per event. The
  headers and the first event go out at once, the rest every ``MS`` ms (0: back to back). ``hold=1``
  sends the headers and the first event, then holds the stream open until the client leaves.
  ``oneread=1``: the head, the ``N`` events and the end in one ``write`` (a batching engine, or a
  node so busy that the proxy reads many events at once). ``done=0``: the stream ends (its last
  chunk) without the ``[DONE]`` event. The router marks such an end ``upstream_truncated``; a proxy
  that follows the stream (``drain-router front``) sees the token budget used and ends it with
  ``[DONE]`` itself: how the tests see that the front follows the ``sse_followed`` streams. A
  ``POST`` body (an OpenAI request, as that workload sends) is read and not looked at: the query
  says the stream's shape.
- ``POST /upload``: reads and discards the body, answers ``{"bytes": n}``.
- ``GET /v1/realtime`` with ``Upgrade: websocket`` and ``Connection: upgrade``: 101, then a WebSocket echo: every data frame
  from the client comes back as one unmasked frame with the same payload, pings get pongs, a Close
  is answered with a Close and the connection closes. Idle sessions cost nothing but the socket.
- ``GET /readyz``: 200 with ``{"ready":true}``: the upstream stands in for a model pod's router, which
  the activator probes there before it forwards (the activator workload, bench/activator_cost.py).
- anything else: 404.

With ``--grpc-port`` it also serves gRPC over h2c (prior knowledge) on that port, just as lean: frames
written from prebuilt bytes, no gRPC library (the fake model's grpcio server spends ~38 µs of CPU
per streamed message and saturates its core at ~26k messages/s here, so it would be what every
proxy row measured):

- ``/vllm.grpc.engine.VllmEngine/Generate`` (server streaming, vLLM's messages): the request's
  ``sampling_params.max_tokens`` ``chunk`` messages of one token, then a ``complete`` (counts and
  finish reason ``length``, no token list) and ``grpc-status: 0``. Each message is one DATA frame
  and one ``write``, as an engine writes each token as it is decoded (the SSE stream's events are
  written the same way). Unpaced, each stream writes up to 16 messages per turn of the loop, as
  fast as flow control allows; with metadata ``bench-interval-ms: MS`` the first message goes at
  once and the next every ``MS`` ms.
- ``/inference.GRPCInferenceService/Echo`` (unary): the request's bytes back.
- any other method: ``grpc-status: 12`` (UNIMPLEMENTED).

Run: ``python -m bench.upstream --port 8000 [--grpc-port 8001]``.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import os
import signal
from functools import cache
from typing import Any
from urllib.parse import parse_qs

from bench import h2

SMALL_BODY = (b'{"object":"model","id":"bench-small","owned_by":"bench","padding":"' + b"x" * 200)[:198] + b'"}'
assert len(SMALL_BODY) == 200

#: One completion event, about the size of an OpenAI streaming chunk with one token.
EVENT = (
    b'data: {"id":"cmpl-bench","object":"text_completion","created":1700000000,'
    b'"model":"bench","choices":[{"index":0,"text":" token","finish_reason":null}]}\n\n'
)
EVENT_CHUNK = b"%x\r\n%s\r\n" % (len(EVENT), EVENT)
DONE = b"data: [DONE]\n\n"
LAST_CHUNK = b"0\r\n\r\n"
DONE_CHUNK = b"%x\r\n%s\r\n%s" % (len(DONE), DONE, LAST_CHUNK)
SSE_HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n"
)
SMALL_RESPONSE = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (
    len(SMALL_BODY),
    SMALL_BODY,
)
READY_BODY = b'{"ready":true}'
READY_RESPONSE = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (
    len(READY_BODY),
    READY_BODY,
)
NOT_FOUND = b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n"
MAX_HEADER_BYTES = 64 * 1024
WS_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
WS_SWITCH = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: "
OP_CLOSE, OP_PING, OP_PONG = 0x8, 0x9, 0xA


@cache
def _whole_stream(chunks: int) -> bytes:
    """A stream of ``chunks`` events with its head and its end, as one piece of bytes."""
    return SSE_HEAD + EVENT_CHUNK * max(chunks, 1) + DONE_CHUNK  # at least one event, as a stream has


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
            if query.get("oneread", ["0"])[0] == "1" and not hold:
                self._one_write(req, chunks)
                return
            end = LAST_CHUNK if query.get("done", ["1"])[0] == "0" else DONE_CHUNK
            self._stream(req, chunks, interval, hold, end)
            return
        elif req.path == "/readyz":
            transport.write(READY_RESPONSE)
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

    def _stream(self, req: _Request, chunks: int, interval: float, hold: bool, end: bytes) -> None:
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
            self._finish(req, end, resume=False)  # we are inside _advance, which goes on by itself
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
                self._finish(req, end, resume=True)
            else:
                self.timer = loop.call_at(start + sent * interval, tick)

        self.timer = loop.call_at(start + interval, tick)

    def _one_write(self, req: _Request, chunks: int) -> None:
        """The whole stream in one ``write``: head, ``chunks`` events and the end (an engine that
        batches its tokens, or a node so busy that the proxy reads them together)."""
        assert self.transport is not None
        self.transport.write(_whole_stream(chunks))
        if req.close:
            self.transport.close()

    def _finish(self, req: _Request, end: bytes, resume: bool) -> None:
        """The stream's ``end`` (``[DONE]`` and the last chunk, or the last chunk alone), then the
        next request on this connection."""
        assert self.transport is not None
        self.transport.write(end)
        self.busy = False
        if req.close:
            self.transport.close()
        elif resume and self.buf:
            self._advance()


# -- gRPC ---------------------------------------------------------------------------------------

GENERATE = b"/vllm.grpc.engine.VllmEngine/Generate"
ECHO = b"/inference.GRPCInferenceService/Echo"
#: Metadata that paces a Generate call (proxies pass it on like any other).
INTERVAL_HEADER = b"bench-interval-ms"
#: The only request headers the gRPC upstream reads.
REQUEST_FIELDS = frozenset((b":path", INTERVAL_HEADER))
GRPC_HEAD = h2.static_block([(b":status", b"200"), (b"content-type", b"application/grpc")])
GRPC_OK = h2.static_block([(b"grpc-status", b"0")])
GRPC_UNIMPLEMENTED = h2.static_block(
    [(b":status", b"200"), (b"content-type", b"application/grpc"), (b"grpc-status", b"12")]
)
#: Unpaced: messages per stream per turn of the loop (each its own ``write``).
GRPC_BATCH = 16
#: The receive window opened to the client, per stream and for the connection.
GRPC_RECV_WINDOW = 1 << 20


@cache
def _engine() -> Any:
    """vLLM's generated messages, imported on first use (the HTTP upstream does without them)."""
    from smg_grpc_proto.generated import vllm_engine_pb2

    return vllm_engine_pb2


@cache
def token_message() -> bytes:
    """One ``GenerateResponse`` chunk of one token, as a gRPC message (the same for every token)."""
    pb = _engine()
    chunk = pb.GenerateStreamChunk(token_ids=[1000], prompt_tokens=8, completion_tokens=1)
    return h2.grpc_message(pb.GenerateResponse(chunk=chunk).SerializeToString())


class _Call:
    __slots__ = ("body", "credit", "data", "frame", "interval", "left", "path", "sid", "timer", "window")

    def __init__(self, sid: int, path: bytes, window: int) -> None:
        self.sid = sid
        self.path = path
        self.window = window
        self.body = bytearray()
        self.left = 0  # Generate: token messages still to send
        self.credit = 0  # token messages that may go now (paced: one per tick)
        self.data = b""  # other DATA bytes to send before the trailers (Echo's body, Generate's last)
        self.frame = b""  # this stream's token message as a DATA frame
        self.interval = 0.0  # Generate: seconds between token messages (0: unpaced)
        self.timer: asyncio.TimerHandle | None = None


class GrpcUpstreamProtocol(asyncio.Protocol):
    """One h2c connection from a client (a proxy, or the load generator)."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.loop = asyncio.get_running_loop()
        self.buf = bytearray()
        self.preface = False
        self.decoder = h2.Picker()
        self.calls: dict[int, _Call] = {}
        self.block: tuple[int, int, bytearray] | None = None
        self.send_window = h2.DEFAULT_WINDOW
        self.peer_initial = h2.DEFAULT_WINDOW
        self.recv_unacked = 0
        self.paused = False
        self.sending: dict[int, _Call] = {}
        self.pump_due = False
        self.out: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        # HEADER_TABLE_SIZE 0: the client's header blocks need no table, so the few headers this
        # server reads are picked out of them without decoding the rest (h2.Picker).
        opening = h2.settings({h2.SETTINGS_HEADER_TABLE_SIZE: 0, h2.SETTINGS_INITIAL_WINDOW_SIZE: GRPC_RECV_WINDOW})
        transport.write(opening + h2.window_update(0, GRPC_RECV_WINDOW - h2.DEFAULT_WINDOW))  # type: ignore[attr-defined]

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        for call in self.calls.values():
            if call.timer is not None:
                call.timer.cancel()
        self.calls.clear()
        self.sending.clear()

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        self._pump()

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if not self.preface:
            if len(self.buf) < len(h2.PREFACE):
                return
            if not self.buf.startswith(h2.PREFACE):
                assert self.transport is not None
                self.transport.close()
                return
            del self.buf[: len(h2.PREFACE)]
            self.preface = True
        found, used = h2.split(self.buf)
        del self.buf[:used]
        for kind, flags, sid, payload in found:
            self._frame(kind, flags, sid, payload)
        self._flush()

    def _flush(self) -> None:
        if self.out:
            if self.transport is not None:
                self.transport.write(b"".join(self.out))
            self.out.clear()

    def _frame(self, kind: int, flags: int, sid: int, payload: bytes) -> None:
        if kind == h2.DATA:
            self.recv_unacked += len(payload)
            if self.recv_unacked >= GRPC_RECV_WINDOW // 2:
                self.out.append(h2.window_update(0, self.recv_unacked))
                self.recv_unacked = 0
            call = self.calls.get(sid)
            if call is None:
                return
            call.body += h2.data_of(flags, payload)
            if len(call.body) >= GRPC_RECV_WINDOW // 2:
                self.out.append(h2.window_update(sid, len(call.body)))  # (Echo of a large body)
            if flags & h2.END_STREAM:
                self._respond(call)
        elif kind == h2.HEADERS:
            block = h2.header_block(flags, payload)
            if flags & h2.END_HEADERS:
                self._headers(sid, flags, block)
            else:
                self.block = (sid, flags, bytearray(block))
        elif kind == h2.CONTINUATION:
            assert self.block is not None
            self.block[2].extend(payload)
            if flags & h2.END_HEADERS:
                first_sid, first_flags, whole = self.block
                self.block = None
                self._headers(first_sid, first_flags, bytes(whole))
        elif kind == h2.WINDOW_UPDATE:
            increment = int.from_bytes(payload, "big") & 0x7FFFFFFF
            if sid == 0:
                self.send_window += increment
            elif (call := self.calls.get(sid)) is not None:
                call.window += increment
            self._schedule()
        elif kind == h2.SETTINGS:
            if flags & h2.ACK:
                self.decoder.table_gone()  # (the only SETTINGS this end sends)
            else:
                initial = h2.parse_settings(payload).get(h2.SETTINGS_INITIAL_WINDOW_SIZE)
                if initial is not None:
                    for call in self.calls.values():
                        call.window += initial - self.peer_initial
                    self.peer_initial = initial
                    self._schedule()
                self.out.append(h2.frame(h2.SETTINGS, h2.ACK, 0))
        elif kind == h2.PING:
            if not flags & h2.ACK:
                self.out.append(h2.frame(h2.PING, h2.ACK, 0, payload))
        elif kind == h2.RST_STREAM:
            self._forget(sid)

    def _headers(self, sid: int, flags: int, block: bytes) -> None:
        fields = self.decoder.pick(block, REQUEST_FIELDS)  # every block, to keep the table right
        call = self.calls.get(sid)
        if call is None:  # a new call
            call = self.calls[sid] = _Call(sid, fields.get(b":path", b""), self.peer_initial)
            call.interval = float(fields.get(INTERVAL_HEADER, 0)) / 1000
        if flags & h2.END_STREAM:
            self._respond(call)

    def _respond(self, call: _Call) -> None:
        out = self.out
        if call.path == ECHO:
            out.append(h2.header(len(GRPC_HEAD), h2.HEADERS, h2.END_HEADERS, call.sid) + GRPC_HEAD)
            call.data = bytes(call.body)
        elif call.path == GENERATE:
            pb = _engine()
            request = pb.GenerateRequest.FromString(bytes(call.body[5:]))
            params = request.sampling_params
            call.left = int(params.max_tokens) if params.HasField("max_tokens") else 16
            prompt = len(request.tokenized.input_ids)
            last = pb.GenerateComplete(finish_reason="length", prompt_tokens=prompt, completion_tokens=call.left)
            call.data = h2.grpc_message(pb.GenerateResponse(complete=last).SerializeToString())
            out.append(h2.header(len(GRPC_HEAD), h2.HEADERS, h2.END_HEADERS, call.sid) + GRPC_HEAD)
            token = token_message()
            call.frame = h2.header(len(token), h2.DATA, 0, call.sid) + token
            if call.interval:
                call.credit = min(1, call.left)
                if call.left > 1:
                    call.timer = self.loop.call_later(call.interval, self._tick, call)
            else:
                call.credit = call.left
        else:
            block = GRPC_UNIMPLEMENTED
            out.append(h2.header(len(block), h2.HEADERS, h2.END_HEADERS | h2.END_STREAM, call.sid) + block)
            del self.calls[call.sid]
            return
        call.body = bytearray()
        self.sending[call.sid] = call
        self._schedule()

    def _tick(self, call: _Call) -> None:
        call.timer = None
        if self.calls.get(call.sid) is not call:
            return
        call.credit += 1
        if call.credit < call.left:
            call.timer = self.loop.call_later(call.interval, self._tick, call)
        self.sending[call.sid] = call
        self._pump()

    def _forget(self, sid: int) -> None:
        call = self.calls.pop(sid, None)
        self.sending.pop(sid, None)
        if call is not None and call.timer is not None:
            call.timer.cancel()

    def _schedule(self) -> None:
        if self.sending and not self.pump_due:
            self.pump_due = True
            self.loop.call_soon(self._pump)

    def _pump(self) -> None:
        """Each call with something to send sends up to :data:`GRPC_BATCH` token messages (or the
        rest of its data and its trailers) within the windows; again next turn while any can."""
        self.pump_due = False
        if self.transport is None or self.paused:
            self._flush()
            return
        out = self.out
        again = False
        for call in list(self.sending.values()):
            room = min(self.send_window, call.window)
            if call.credit:
                size = len(call.frame) - 9
                n = min(call.credit, GRPC_BATCH, room // size)
                if n <= 0:
                    continue
                self._flush()
                write = self.transport.write
                for _ in range(n):
                    write(call.frame)
                call.credit -= n
                call.left -= n
                self.send_window -= n * size
                call.window -= n * size
                if call.credit:
                    again = True
                    continue
            if call.left:
                del self.sending[call.sid]  # paced: until the next tick
                continue
            if call.data:
                take = min(room, len(call.data), h2.MAX_FRAME)
                if take <= 0:
                    continue
                out.append(h2.header(take, h2.DATA, 0, call.sid) + call.data[:take])
                call.data = call.data[take:]
                self.send_window -= take
                call.window -= take
                if call.data:
                    again = True
                    continue
            out.append(h2.header(len(GRPC_OK), h2.HEADERS, h2.END_HEADERS | h2.END_STREAM, call.sid) + GRPC_OK)
            self._forget(call.sid)
        self._flush()
        if again:
            self._schedule()


async def serve(host: str, port: int, grpc_port: int | None = None) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(UpstreamProtocol, host, port, backlog=4096, reuse_address=True)
    if grpc_port is not None:
        grpc_server = await loop.create_server(GrpcUpstreamProtocol, host, grpc_port, backlog=4096, reuse_address=True)
        print(f"bench upstream gRPC on {host}:{grpc_port}", flush=True)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"bench upstream listening on {host}:{port} pid {os.getpid()}", flush=True)
    await stop.wait()
    server.close()
    if grpc_port is not None:
        grpc_server.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.upstream", description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--grpc-port", type=int, help="also serve gRPC (h2c) on this port")
    args = parser.parse_args(argv)
    import uvloop

    uvloop.run(serve(args.host, args.port, args.grpc_port))


if __name__ == "__main__":
    main()
