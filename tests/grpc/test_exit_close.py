"""A client connection closed at the router's exit, on a real router process and a raw socket: the
client still sending frames there must read the last call whole and a FIN, never a reset (a reset
makes the client's kernel discard what it received but had not read yet)."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket

import hpack
from hyperframe import frame as hf

from tests import grpcupstream
from tests.grpc.conftest import StartGrpcRouter
from tests.h2client import PREFACE, message, request_headers

#: The client's receive buffer, kept small so that the router's last frames wait in the router's
#: kernel while the client does not read (a reset there discards them).
CLIENT_RCVBUF = 4096
#: The answer: more than the client's receive buffer holds.
MESSAGES, MESSAGE_SIZE = 5, 20_000
WINDOW = 1 << 20
#: How often the client sends a WINDOW_UPDATE while it does not read (its pace, not a wait for an event).
SEND_EVERY_SECS = 0.02


def _window_update(increment: int = 1) -> bytes:
    return bytes(hf.WindowUpdateFrame(0, window_increment=increment).serialize())


async def _send_until(sock: socket.socket, stop: asyncio.Event) -> None:
    """Frames the router does not need, until ``stop``; then one more, as a client that has not read
    the router's last frames yet still sends."""
    loop = asyncio.get_running_loop()
    while not stop.is_set():
        await loop.sock_sendall(sock, _window_update())
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), SEND_EVERY_SECS)
    with contextlib.suppress(OSError):  # (a reset already: the read sees it)
        await loop.sock_sendall(sock, _window_update())


def _read_all(sock: socket.socket) -> tuple[bytes, bool]:
    """Everything the router sent, and whether it ended with a reset rather than a FIN."""
    sock.setblocking(True)
    sock.settimeout(5)
    received = bytearray()
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            return bytes(received), True
        if not chunk:
            return bytes(received), False
        received += chunk


def _frames(data: bytes) -> list[hf.Frame]:
    found = []
    view = memoryview(data)
    while len(view) >= 9:
        frame, length = hf.Frame.parse_frame_header(view[:9])
        if len(view) < 9 + length:
            break  # cut short by a reset
        frame.parse_body(view[9 : 9 + length])
        found.append(frame)
        view = view[9 + length :]
    return found


async def test_the_last_call_at_exit_is_read_whole_by_a_client_still_sending(
    grpc_router: StartGrpcRouter, upstream: grpcupstream.Upstream
) -> None:
    """A call in flight at the second SIGTERM ends while its client, not reading, keeps sending
    WINDOW_UPDATEs; the router exits 0 and the client then reads every message, the trailers with
    grpc-status 0, and a FIN: no ConnectionResetError."""
    router = await grpc_router(drain_secs="30")
    assert router.grpc_port is not None
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, CLIENT_RCVBUF)
    sock.connect(("127.0.0.1", router.grpc_port))
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    encoder = hpack.Encoder()
    opening = hf.HeadersFrame(1, flags=["END_HEADERS"])
    opening.data = encoder.encode(request_headers("/t.T/Stream"))
    body = hf.DataFrame(1, flags=["END_STREAM"])
    body.data = message(b"%d 200 %d" % (MESSAGES, MESSAGE_SIZE))
    settings = hf.SettingsFrame(0)
    settings.settings = {hf.SettingsFrame.INITIAL_WINDOW_SIZE: WINDOW}
    await loop.sock_sendall(
        sock,
        PREFACE
        + settings.serialize()
        + _window_update(WINDOW)
        + hf.SettingsFrame(0, flags=["ACK"]).serialize()  # the router's SETTINGS, acknowledged unread
        + opening.serialize()
        + body.serialize(),
    )
    stop = asyncio.Event()
    sending = asyncio.ensure_future(_send_until(sock, stop))
    await upstream.wait_active(1)
    router.signal(signal.SIGTERM)
    await router.wait_event("drain.start")
    router.signal(signal.SIGTERM)
    await router.wait_event("drain.complete")  # the call ended: the router closes the connection and exits
    stop.set()
    await asyncio.wait_for(sending, 10)

    data, reset = await asyncio.to_thread(_read_all, sock)
    sock.close()
    assert await router.wait(10) == 0
    frames = _frames(data)
    decoder = hpack.Decoder()
    blocks = [(f, dict(decoder.decode(f.data, raw=True))) for f in frames if isinstance(f, hf.HeadersFrame)]
    trailers = [h for f, h in blocks if f.stream_id == 1 and "END_STREAM" in f.flags]
    payload = b"".join(f.data for f in frames if isinstance(f, hf.DataFrame) and f.stream_id == 1)
    assert not reset, f"reset after {len(data)} bytes: {[type(f).__name__ for f in frames]}"
    assert payload.count(b"tok") == MESSAGES
    assert [h.get(b"grpc-status") for h in trailers] == [b"0"]
    assert [f.last_stream_id for f in frames if isinstance(f, hf.GoAwayFrame)][-1] == 1
