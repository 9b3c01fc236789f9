"""The activator under hostile clients, black-box over raw sockets: it is the router's traffic path,
so the router's bounds hold for it too, and holding adds none of its own buffers.

1. A held request's body is not read into memory while it waits: a client uploading 64 MiB to a
   sleeping service is held back (its RSS grows by less than 8 MiB, the upload is not accepted
   whole), and once a pod is ready the whole body reaches the model server.
2. Many held requests cost a bounded amount each (under 64 KiB of RSS per held request).
3. A head past the router's limits is answered 431, and a service header with bytes no service name
   has is answered 400, never held.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from drain_router_dev import fake_kube
from drain_router_dev.fake_kube import NAME, NS
from drain_router_dev.process import wait_until
from tests.activator import stand_ins
from tests.activator.stand_ins import POD_IP, SERVICE, Client, held, wait_held
from tests.blackbox import settled, settled_rss

UPLOAD_BYTES = 64 * 1024 * 1024
PIECE = b"0123456789abcdef" * 16384  # 256 KiB
HELD = 200


async def test_a_held_upload_is_held_back_not_buffered(kube: fake_kube.FakeKube) -> None:
    async with stand_ins.recording_pod() as pod:
        kube.services[(NS, NAME)] = fake_kube.modelservice(port=pod.port)
        async with stand_ins.activator(kube.url) as act:
            assert act.proc.pid is not None
            before = await settled_rss(act.proc.pid, settle=0.5)
            reader, writer = await asyncio.open_connection("127.0.0.1", act.port)
            writer.transport.set_write_buffer_limits(high=256 * 1024)
            writer.write(
                b"POST /hold?id=up HTTP/1.1\r\nHost: x\r\nx-drain-router-service: %s\r\nContent-Length: %d\r\n\r\n"
                % (SERVICE.encode(), UPLOAD_BYTES)
            )
            sent = 0

            async def upload() -> None:
                nonlocal sent
                while sent < UPLOAD_BYTES:
                    writer.write(PIECE)
                    await writer.drain()
                    sent += len(PIECE)

            uploading = asyncio.ensure_future(upload())
            await wait_held(act.admin_port, 1)
            await settled(lambda: sent, settle=1.0, timeout=20, what="the bytes the upload sent")
            grew = await settled_rss(act.proc.pid) - before
            assert not uploading.done(), "the held upload was accepted whole"
            assert sent < UPLOAD_BYTES // 2, f"{sent} bytes accepted from a held client"
            assert grew < 8 * 1024 * 1024, f"activator RSS grew {grew / 2**20:.1f} MiB holding an upload"

            kube.pods = [fake_kube.pod(POD_IP, "llama-0")]
            await asyncio.wait_for(uploading, 60)
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
            assert head.startswith(b"HTTP/1.1 200"), head
            length = int(
                next(
                    v
                    for k, _, v in (line.partition(b":") for line in head.split(b"\r\n"))
                    if k.lower() == b"content-length"
                )
            )
            body = json.loads(await asyncio.wait_for(reader.readexactly(length), 30))
            assert body["id"] == "up" and len(body["body"]) == UPLOAD_BYTES
            writer.close()


async def test_held_requests_cost_bounded_memory_each(kube: fake_kube.FakeKube) -> None:
    kube.services[(NS, NAME)] = fake_kube.modelservice(port=1)
    async with stand_ins.activator(kube.url, "--queue-size", str(HELD)) as act:
        assert act.proc.pid is not None
        warm = await Client.send(act.port, "/hold?id=warm")
        await wait_held(act.admin_port, 1)
        before = await settled_rss(act.proc.pid, settle=0.5)
        for i in range(HELD - 1):
            await Client.send(act.port, f"/hold?id={i}")
        await wait_until(lambda: held(act.admin_port), 10, f"{HELD} held", until=lambda n: n == HELD)
        per_request = (await settled_rss(act.proc.pid) - before) / (HELD - 1)
        assert per_request < 64 * 1024, f"{per_request / 1024:.0f} KiB per held request"
        warm.close()


@pytest.mark.parametrize(
    ("extra", "status"),
    [
        (b"x-big: " + b"a" * 40_000 + b"\r\n", 431),
        (b"x-drain-router-service: models/\xffllama\r\n", 400),
        (b"x-drain-router-service: " + b"a" * 64 + b"/" + b"b" * 300 + b"\r\n", 400),
    ],
    ids=["head-too-large", "non-ascii-service", "service-name-too-long"],
)
async def test_bad_heads_are_refused_never_held(kube: fake_kube.FakeKube, extra: bytes, status: int) -> None:
    kube.services[(NS, NAME)] = fake_kube.modelservice(port=1)
    async with stand_ins.activator(kube.url) as act:
        reader, writer = await asyncio.open_connection("127.0.0.1", act.port)
        writer.write(b"GET /hold HTTP/1.1\r\nHost: x\r\n" + extra + b"\r\n")
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        assert head.startswith(b"HTTP/1.1 %d" % status), head
        assert await held(act.admin_port) == 0 and kube.reads == 0
        writer.close()
