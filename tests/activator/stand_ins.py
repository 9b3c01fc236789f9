"""The activator's world, stood in: a Kubernetes API serving the port map's ConfigMap, one kind of
ModelService, its status subresource and the pods list (:class:`~drain_router_dev.fake_kube.FakeKube`, recording every
call; the package's own), a model server that records
the order requests reach it and echoes WebSocket messages (:class:`Model`), raw clients, and
processes (the activator, and ``drain-router serve`` as a model pod's router)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import json
import os
import sys
from collections.abc import AsyncIterator

import aiohttp
from aiohttp import web

from drain_router_dev import fake_kube
from drain_router_dev import process as process_
from tests.blackbox import RawClient, metric_samples, status_of
from tests.process import RouterProcess, log_path

NS, NAME = fake_kube.NS, fake_kube.NAME
SERVICE = f"{NS}/{NAME}"
POD_IP = "127.0.0.2"
"""The model pod's address: its router listens there (loopback, as a pod IP)."""
DEAD_POD_IP = "127.0.0.3"
"""A listed pod whose router does not answer (nothing listens there)."""


MAX_BODY = 128 * 1024 * 1024
"""The model server reads request bodies up to this (aiohttp's own default is 1 MiB)."""


@dataclasses.dataclass
class Model:
    """``/hold?id=X``: records X in arrival order, answers ``{"id": X}`` (after ``wait`` seconds, if
    given); ``/ws``: a WebSocket echo (``/ws?close_wait=S``: one slow to answer a Close, by S seconds)."""

    arrived: list[str] = dataclasses.field(default_factory=list)
    closes: list[int | None] = dataclasses.field(default_factory=list)
    """The close code of each WebSocket session, as it ended (1006 when its late answer to a Close
    found the connection gone)."""
    url: str = ""

    async def hold(self, request: web.Request) -> web.Response:
        body = await request.read()
        self.arrived.append(request.query.get("id", ""))
        await asyncio.sleep(float(request.query.get("wait", "0")))
        return web.json_response({"id": request.query.get("id", ""), "body": body.decode()})

    async def ws(self, request: web.Request) -> web.WebSocketResponse:
        close_wait = float(request.query.get("close_wait", "0"))
        socket = web.WebSocketResponse(autoclose=not close_wait)
        await socket.prepare(request)
        async for message in socket:
            await socket.send_str("echo:" + message.data)
        if close_wait:  # the peer's Close read, answered late (the code becomes 1006 if it cannot be sent)
            await asyncio.sleep(close_wait)
            await socket.close(code=socket.close_code or 1000)
        self.closes.append(socket.close_code)
        return socket


@contextlib.asynccontextmanager
async def model_server() -> AsyncIterator[Model]:
    model = Model()
    app = web.Application(client_max_size=MAX_BODY)
    app.router.add_route("*", "/hold", model.hold)
    app.router.add_get("/ws", model.ws)
    async with fake_kube.serving(app, "127.0.0.1") as url:
        model.url = url
        yield model


@dataclasses.dataclass
class RecordingPod:
    """A model pod with no router in between: the model server and ``/readyz`` (200) on ``port`` of
    :data:`POD_IP`, as a router answers both on its traffic port: what reaches it is in the order the
    activator sent it."""

    model: Model
    port: int = 0
    ready: bool = True
    """What its ``/readyz`` answers (200 or 503)."""

    async def readyz(self, request: web.Request) -> web.Response:
        return web.json_response({"ready": self.ready}, status=200 if self.ready else 503)


@contextlib.asynccontextmanager
async def recording_pod() -> AsyncIterator[RecordingPod]:
    model = Model()
    app = web.Application(client_max_size=MAX_BODY)
    app.router.add_route("*", "/hold", model.hold)
    pod = RecordingPod(model)
    app.router.add_get("/readyz", pod.readyz)
    async with fake_kube.serving(app, POD_IP) as url:
        model.url = url
        pod.port = int(url.rsplit(":", 1)[1])
        yield pod


def activator_argv(kube_url: str, *args: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "drain_router",
        "activator",
        "--host",
        "127.0.0.1",
        "--admin-host",
        "127.0.0.1",
        "--admin-port",
        "0",
        "--kube-api",
        kube_url,
        "--ports-configmap",
        fake_kube.PORTS_CONFIGMAP,
        "--poll-interval-secs",
        "0.1",
        "--shutdown-drain-secs",
        "0",
        *args,
    ]


@contextlib.asynccontextmanager
async def activator(kube_url: str, *args: str) -> AsyncIterator[RouterProcess]:
    proc = process_.Process("activator", activator_argv(kube_url, *args), log_path("activator"))
    proc.start()
    p = RouterProcess(proc)
    try:
        await p.wait_event("startup.listening")
        yield p
    finally:
        await p.kill()


@contextlib.asynccontextmanager
async def listening(kube: fake_kube.FakeKube, *args: str) -> AsyncIterator[RouterProcess]:
    """:func:`activator`, once it listens on every port of the port map."""
    async with activator(kube.url, *args) as act:
        assert act.admin_port is not None
        await wait_listening(act.admin_port, kube.ports)
        yield act


@contextlib.asynccontextmanager
async def pod_router(upstream: str) -> AsyncIterator[RouterProcess]:
    """``drain-router serve`` on the pod's address in front of the model server."""
    p = await RouterProcess.start(
        "--upstream", upstream, "--host", POD_IP, "--admin-host", POD_IP, "--shutdown-drain-secs", "0"
    )
    try:
        await p.wait_event("startup.listening")
        yield p
    finally:
        await p.kill()


def assign(kube: fake_kube.FakeKube, *entries: str) -> list[int]:
    """Free ports for ``entries`` (``<namespace>/<name>/<protocol>``), added to the port map."""
    ports = [process_.free_port() for _ in entries]
    kube.ports = {**(kube.ports or {}), **{str(port): entry for port, entry in zip(ports, entries, strict=True)}}
    return ports


async def listened(admin_port: int) -> dict[str, str]:
    """``/admin/ports``' ports: what the activator listens on now."""
    async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{admin_port}/admin/ports") as resp:
        assert resp.status == 200
        return dict((await resp.json())["ports"])


async def wait_listening(admin_port: int, ports: dict[str, str] | None, timeout: float = 5.0) -> None:
    """Until ``/admin/ports`` lists exactly ``ports`` (the port map's data)."""
    wanted = dict(ports or {})
    await process_.wait_until(
        lambda: listened(admin_port), timeout, f"listening on {wanted}", until=lambda v: v == wanted
    )


async def metric(admin_port: int, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return await metric_samples(admin_port, name)


async def held(admin_port: int, service: str = SERVICE) -> float:
    return (await metric(admin_port, "drain_router_activator_held_requests")).get((("service", service),), 0.0)


async def wait_held(admin_port: int, n: int, timeout: float = 5.0, service: str = SERVICE) -> None:
    await process_.wait_until(lambda: held(admin_port, service), timeout, f"{n} held", until=lambda v: v == n)


class Client(RawClient):
    """One raw request to one of the activator's ports (``extra``: more header lines)."""

    @classmethod
    async def send(cls, port: int, target: str, body: str | None = None, extra: str = "") -> Client:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        named = extra
        method, framing = ("GET", "") if body is None else ("POST", f"Content-Length: {len(body)}\r\n")
        writer.write(f"{method} {target} HTTP/1.1\r\nHost: x\r\n{named}{framing}\r\n{body or ''}".encode())
        await writer.drain()
        return cls(reader, writer)


def body_id(body: bytes) -> str:
    return str(json.loads(body)["id"])


class WsClient(RawClient):
    """A raw WebSocket session on one of the activator's ports, closed as RFC 6455 (7.1.1) has a
    client close: it answers a Close with its own and leaves closing the connection to the server.
    (aiohttp's client closes it at once, which ends the tunnel before a slow model server's side has
    answered its Close.) Short frames only."""

    @classmethod
    async def connect(cls, port: int, target: str) -> WsClient:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        client = cls(reader, writer)
        key = base64.b64encode(os.urandom(16)).decode()
        writer.write(
            f"GET {target} HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
            f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n".encode()
        )
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10.0)
        assert status_of(head) == 101, head
        return client

    def send_frame(self, opcode: int, payload: bytes) -> None:
        mask = os.urandom(4)
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        self.writer.write(bytes([0x80 | opcode, 0x80 | len(payload)]) + mask + masked)

    async def read_frame(self, timeout: float = 10.0) -> tuple[int, bytes]:
        """The next frame from the server: its opcode and payload."""
        b0, b1 = await asyncio.wait_for(self.reader.readexactly(2), timeout)
        return b0 & 0x0F, await asyncio.wait_for(self.reader.readexactly(b1 & 0x7F), timeout)
