"""The activator under hostile clients, black-box over raw sockets: it is the router's traffic path,
so the router's bounds hold for it too, and holding adds none of its own buffers.

1. A held request's body is not read into memory while it waits: a client uploading 64 MiB to a
   sleeping service is held back (its RSS grows by less than 8 MiB, the upload is not accepted
   whole), and once a pod is ready the whole body reaches the model server.
2. Many held requests cost a bounded amount each (under 64 KiB of RSS per held request).
3. A head past the router's limits is answered 431, and an HTTP/2 preface on an ``http`` port 400:
   neither held, neither a wake.
4. Only the port decides the service: 1000 connections to ports the map assigns nobody are refused
   by the kernel at once while an assigned sleeping service still wakes; a request carrying another
   tenant's name (header, Host) on a port reaches that port's service only; 1000 requests to a
   service whose ModelService answers 403 are answered 503 at once, with the API calls bounded by
   the poll interval, not by the requests.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from drain_router_dev import fake_kube
from drain_router_dev import process as process_
from drain_router_dev.fake_kube import NAME, NS
from drain_router_dev.process import wait_until
from tests.activator import stand_ins
from tests.activator.stand_ins import POD_IP, SERVICE, Client, held, wait_held

HTTP = f"{SERVICE}/http"
from tests.blackbox import settled, settled_rss

UPLOAD_BYTES = 64 * 1024 * 1024
PIECE = b"0123456789abcdef" * 16384  # 256 KiB
HELD = 200


async def test_a_held_upload_is_held_back_not_buffered(kube: fake_kube.FakeKube) -> None:
    async with stand_ins.recording_pod() as pod:
        kube.services[(NS, NAME)] = fake_kube.modelservice(port=pod.port)
        [port] = stand_ins.assign(kube, HTTP)
        async with stand_ins.listening(kube) as act:
            assert act.proc.pid is not None
            before = await settled_rss(act.proc.pid, settle=0.5)
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.transport.set_write_buffer_limits(high=256 * 1024)
            writer.write(b"POST /hold?id=up HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % UPLOAD_BYTES)
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
    [port] = stand_ins.assign(kube, HTTP)
    async with stand_ins.listening(kube, "--queue-size", str(HELD)) as act:
        assert act.proc.pid is not None
        warm = await Client.send(port, "/hold?id=warm")
        await wait_held(act.admin_port, 1)
        before = await settled_rss(act.proc.pid, settle=0.5)
        for i in range(HELD - 1):
            await Client.send(port, f"/hold?id={i}")
        await wait_until(lambda: held(act.admin_port), 10, f"{HELD} held", until=lambda n: n == HELD)
        per_request = (await settled_rss(act.proc.pid) - before) / (HELD - 1)
        assert per_request < 64 * 1024, f"{per_request / 1024:.0f} KiB per held request"
        warm.close()


@pytest.mark.parametrize(
    ("sent", "status"),
    [
        (b"GET /hold HTTP/1.1\r\nHost: x\r\nx-big: " + b"a" * 40_000 + b"\r\n\r\n", 431),
        (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 400),  # an h2c client on an http port
    ],
    ids=["head-too-large", "http2-preface"],
)
async def test_bad_heads_are_refused_never_held(kube: fake_kube.FakeKube, sent: bytes, status: int) -> None:
    kube.services[(NS, NAME)] = fake_kube.modelservice(port=1)
    [port] = stand_ins.assign(kube, HTTP)
    async with stand_ins.listening(kube) as act:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(sent)
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        assert head.startswith(b"HTTP/1.1 %d" % status), head
        assert await held(act.admin_port) == 0
        assert kube.reads == 0 and kube.patches == [], "a refused head reached the API (a wake)"
        writer.close()


CONNECTIONS = 1000
LONG_POLL = 20
"""A poll interval far longer than 1000 refusals take even on a busy machine (3.2 s seen at a load of
13 on 2 cores): a refusal that waited for the next read would take this long."""


async def test_unassigned_ports_are_refused_at_once_while_an_assigned_service_wakes(kube) -> None:
    """1. a sleeping service's port assigned, a request held on it  2. 1000 connections to ports the
    map assigns nobody: each refused by the kernel (ECONNREFUSED: nothing listens there, so nothing
    can hold it), none accepted  3. the held request is still forwarded once the pod is ready."""
    async with stand_ins.recording_pod() as pod:
        kube.services[(NS, NAME)] = fake_kube.modelservice(port=pod.port)
        [port] = stand_ins.assign(kube, HTTP)
        unassigned = [process_.free_port() for _ in range(20)]
        async with stand_ins.listening(kube) as act:
            client = await Client.send(port, "/hold?id=a")
            await wait_held(act.admin_port, 1)
            outcomes = await asyncio.gather(
                *(asyncio.open_connection("127.0.0.1", unassigned[i % 20]) for i in range(CONNECTIONS)),
                return_exceptions=True,
            )
            assert all(isinstance(o, ConnectionRefusedError) for o in outcomes), {type(o) for o in outcomes}
            kube.pods = [fake_kube.pod(POD_IP, "llama-0")]
            status, _, body = await client.answer()
            assert (status, stand_ins.body_id(body)) == (200, "a")
            assert pod.model.arrived == ["a"]


async def test_a_request_reaches_only_its_ports_service(kube) -> None:
    """1. tenant A awake (its pod ready), tenant B asleep, each with its port  2. a request on B's
    port naming A every way a client can (the old service header, Host, a forwarded host) is held
    for B and never reaches A's pod  3. a request on A's port naming B reaches A's pod."""
    async with stand_ins.recording_pod() as pod:
        kube.services[(NS, NAME)] = fake_kube.modelservice(port=pod.port)
        kube.services[("tenant-b", "other")] = fake_kube.modelservice(port=1, namespace="tenant-b", name="other")
        kube.pods = [fake_kube.pod(POD_IP, "llama-0", labels={"app": NAME, "tier": "model"})]
        a_port, b_port = stand_ins.assign(kube, HTTP, "tenant-b/other/http")
        async with stand_ins.listening(kube) as act:
            naming_a = f"x-drain-router-service: {SERVICE}\r\nx-forwarded-host: {NAME}.{NS}\r\n"
            _, writer = await asyncio.open_connection("127.0.0.1", b_port)
            writer.write(f"GET /hold?id=b HTTP/1.1\r\nHost: {NAME}.{NS}\r\n{naming_a}\r\n".encode())
            await wait_held(act.admin_port, 1, service="tenant-b/other")
            assert await held(act.admin_port) == 0

            status, _, body = await (
                await Client.send(a_port, "/hold?id=a", extra="x-drain-router-service: tenant-b/other\r\n")
            ).answer()
            assert (status, stand_ins.body_id(body)) == (200, "a")
            await wait_until(lambda: kube.calls_to("GET", "/pods"), 5.0, "B's pods listed")
            assert pod.model.arrived == ["a"], "a request on B's port reached A's pod"
            assert await held(act.admin_port, "tenant-b/other") == 1
            writer.close()


async def test_a_forbidden_service_is_refused_at_once_with_bounded_api_calls(kube) -> None:
    """1. a port assigned to a service the activator may not read (403), a poll interval of
    :data:`LONG_POLL` s  2. 1000 requests on it, 50 connections at a time: every one answered 503 at
    once (all of them within half a poll interval: a request held until the next read would wait a
    whole one, and its client give up first), in words that name nothing; none held  3. the API saw
    at most one read of it per poll interval since the first, plus one, and no patch and no pod
    list."""
    kube.services[("tenant-b", "other")] = fake_kube.modelservice(port=1, namespace="tenant-b", name="other")
    kube.forbidden.add(("tenant-b", "other"))
    [port] = stand_ins.assign(kube, "tenant-b/other/http")
    async with stand_ins.listening(kube, "--poll-interval-secs", str(LONG_POLL)) as act:
        loop = asyncio.get_running_loop()
        started = loop.time()

        async def one(i: int) -> tuple[int, bytes]:
            status, _, body = await (await Client.send(port, f"/hold?id={i}")).answer(timeout=5.0)
            return status, body

        answers: list[tuple[int, bytes]] = []
        for first in range(0, CONNECTIONS, 50):
            answers += await asyncio.gather(*(one(i) for i in range(first, first + 50)))
        took = loop.time() - started
        assert took < LONG_POLL / 2, f"{CONNECTIONS} refusals took {took:.2f} s: held until the next read"
        assert {status for status, _ in answers} == {503}
        assert all(b"service_unavailable" in body and b"tenant-b" not in body for _, body in answers)
        reads = kube.calls_to("GET", "/modelservices/other")
        assert 1 <= reads <= took / LONG_POLL + 2, f"{reads} reads for {CONNECTIONS} requests in {took:.2f} s"
        assert kube.patches == [] and kube.calls_to("GET", "/pods") == 0
        assert await held(act.admin_port, "tenant-b/other") == 0
        refusals = await stand_ins.metric(act.admin_port, "drain_router_activator_refused_total")
        assert refusals[(("reason", "forbidden"),)] == CONNECTIONS


async def test_clients_that_come_and_go_cannot_drive_the_api(kube) -> None:
    """1. a sleeping service, a poll interval of 1 s  2. 30 clients one after another, each held then
    gone at once (every one restarts its service's polling)  3. the API saw at most one read and one
    pod list per poll interval since the first, plus one, and one wake patch."""
    kube.services[(NS, NAME)] = fake_kube.modelservice(port=1)
    [port] = stand_ins.assign(kube, HTTP)
    async with stand_ins.listening(kube, "--poll-interval-secs", "1") as act:
        loop = asyncio.get_running_loop()
        started = loop.time()
        for i in range(30):
            client = await Client.send(port, f"/hold?id={i}")
            await wait_held(act.admin_port, 1)
            await wait_until(lambda: kube.calls_to("GET", f"/modelservices/{NAME}"), 5.0, "the first read")
            client.close()
            await wait_held(act.admin_port, 0)
        took = loop.time() - started
        reads, lists = kube.calls_to("GET", f"/modelservices/{NAME}"), kube.calls_to("GET", "/pods")
        assert reads <= took / 1.0 + 2 and lists <= took / 1.0 + 2, (reads, lists, took)
        assert len(kube.patches) == 1
