"""``drain-router activator``, black-box: a real activator process, a stand-in Kubernetes API (the
port map, its ModelService, the status subresource, the pods list), and a model pod made of a real
``drain-router serve`` on its own address (127.0.0.2) in front of a model server that records
arrival order. Every request goes to the port the port map assigns its service.

1. Requests for a sleeping service are held; the wake is asked for once, by a status patch with the
   resourceVersion read (a 409 reads again); nothing is forwarded while no listed pod's router
   answers ready; once one does, every held request reaches the model server in arrival order.
2. A full queue answers 429, a hold past --activation-timeout-secs 503, both with Retry-After from
   the service's last cold start; a client that leaves frees its place.
3. A service that does not exist is answered 404 at once; --max-services bounds the listeners.
4. A WebSocket handshake is held, then relayed: the tunnel works end to end.
5. SIGTERM: /readyz 503, then held requests get 503 with Connection: close, what is forwarded
   finishes, and it exits 0; every port's WebSocket sessions get Close 1001 and finish their closing
   handshakes before it exits.
6. A service whose pod stops answering ready holds again, and forwards again once one does.
"""

from __future__ import annotations

import asyncio
import json
import signal
import struct
from collections.abc import AsyncIterator

import aiohttp
import pytest

from drain_router.decisions import activation
from drain_router_dev import fake_kube
from drain_router_dev.process import wait_until
from tests.activator import stand_ins
from tests.activator.stand_ins import DEAD_POD_IP, NAME, NS, POD_IP, SERVICE, Client, body_id, held, wait_held

HTTP = f"{SERVICE}/http"
OTHER = "mistral"
"""A second ModelService, on a port of its own."""
TEXT, CLOSE = 0x1, 0x8
GOING_AWAY = struct.pack("!H", 1001)


@pytest.fixture
async def model() -> AsyncIterator[stand_ins.Model]:
    async with stand_ins.model_server() as server:
        yield server


@pytest.fixture
async def pod(model):
    async with stand_ins.pod_router(model.url) as router:
        yield router


async def test_held_requests_wake_the_service_and_reach_the_model_in_arrival_order(kube, model, pod) -> None:
    """1. five requests held, one by one  2. the wake: a 409, then one patch with the version read
    3. a listed pod whose router does not answer: still held  4. the pod's router listed: all five
    answered by the model server, in arrival order."""
    kube.services[(NS, NAME)] = fake_kube.modelservice(port=pod.port)
    kube.conflicts = 1
    [port] = stand_ins.assign(kube, HTTP)
    async with stand_ins.listening(kube) as act:
        ids = [f"r{i}" for i in range(5)]
        clients = []
        for i, id_ in enumerate(ids):
            clients.append(await Client.send(port, f"/hold?id={id_}"))
            await wait_held(act.admin_port, i + 1)
        await wait_until(lambda: kube.accepted(), 5.0, "the wake patch")
        kube.pods = [fake_kube.pod(DEAD_POD_IP, "llama-dead")]
        await wait_until(lambda: len(kube.selectors) >= 3, 5.0, "pods listed")
        assert model.arrived == []
        assert await held(act.admin_port) == 5

        kube.pods = [fake_kube.pod(DEAD_POD_IP, "llama-dead"), fake_kube.pod(POD_IP, "llama-0")]
        answers = [await c.answer() for c in clients]
        assert [(status, body_id(body)) for status, _, body in answers] == [(200, i) for i in ids]
        assert sorted(model.arrived) == ids, "each reached the model server once, none lost"
        assert await held(act.admin_port) == 0
        assert (await stand_ins.metric(act.admin_port, "drain_router_activations_total"))[()] == 1
        assert (await stand_ins.metric(act.admin_port, "drain_router_activation_seconds_count"))[()] == 1

        # Forwarding now: a new request goes straight through.
        late = await Client.send(port, "/hold?id=late")
        status, _, body = await late.answer()
        assert (status, body_id(body)) == (200, "late")
    statuses = [code for _, _, code in kube.patches]
    assert statuses == [409, 200], "one 409, read again, then the wake, once"
    content_type, patch, _ = kube.patches[1]
    assert content_type == "application/merge-patch+json"
    assert patch["metadata"] == {"resourceVersion": "2"}  # the version read after the 409
    assert "wakeRequestedAt" in patch["status"]["lifecycle"]
    assert kube.selectors[0] == "app=llama,tier=model"


async def test_held_requests_leave_in_arrival_order(kube) -> None:
    """1. twenty POSTs held, one by one, their bodies with them  2. a pod ready (no router in between: the pod's own router
    would reorder them as it opens its connections to the model server concurrently)  3. they reach
    it in arrival order, on connections the activator opened ahead of them, each with its body."""
    async with stand_ins.recording_pod() as pod:
        kube.services[(NS, NAME)] = fake_kube.modelservice(port=pod.port)
        [port] = stand_ins.assign(kube, HTTP)
        async with stand_ins.listening(kube) as act:
            ids = [f"r{i:02}" for i in range(20)]
            clients = []
            for i, id_ in enumerate(ids):
                clients.append(await Client.send(port, f"/hold?id={id_}", body=f'{{"prompt": "{id_}"}}'))
                await wait_held(act.admin_port, i + 1)
            assert pod.model.arrived == []
            kube.pods = [fake_kube.pod(POD_IP, "llama-0")]
            answers = [await c.answer() for c in clients]
            assert [status for status, _, _ in answers] == [200] * len(ids)
            assert pod.model.arrived == ids
            assert [json.loads(body)["body"] for _, _, body in answers] == [f'{{"prompt": "{i}"}}' for i in ids]


async def test_queue_full_timeout_and_a_client_leaving(kube) -> None:
    """1. two held (--queue-size 2): a third is answered 429  2. one client leaves: its place is free,
    a new one is held  3. past --activation-timeout-secs: 503; every refusal's Retry-After is the
    service's last cold start."""
    kube.services[(NS, NAME)] = fake_kube.modelservice(port=1, cold_start=7.3)
    expected = str(activation.retry_after(7.3))
    assert expected == "8"
    [port] = stand_ins.assign(kube, HTTP)
    async with stand_ins.listening(kube, "--queue-size", "2", "--activation-timeout-secs", "2") as act:
        first = await Client.send(port, "/hold?id=a")
        await wait_held(act.admin_port, 1)
        leaving = await Client.send(port, "/hold?id=b")
        await wait_held(act.admin_port, 2)
        # The cold start is taken from the read before the wake is asked for: once the patch came, it is set.
        await wait_until(lambda: kube.patches, 5.0, "the service read and the wake asked for")
        full = await Client.send(port, "/hold?id=c")
        status, headers, body = await full.answer(timeout=2.0)
        assert status == 429 and headers["retry-after"] == expected, (status, headers, body)

        leaving.close()
        await wait_held(act.admin_port, 1)
        second = await Client.send(port, "/hold?id=d")
        await wait_held(act.admin_port, 2)

        for client in (first, second):
            status, headers, _ = await client.answer(timeout=5.0)
            assert status == 503 and headers["retry-after"] == expected
        assert await held(act.admin_port) == 0
        assert (await stand_ins.metric(act.admin_port, "drain_router_activation_timeouts_total"))[()] == 2


async def test_a_missing_service_is_answered_404_and_max_services_bounds_the_listeners(kube) -> None:
    """1. --max-services 1, the map assigns two services: only the lower port listens (a warning
    names the other), the other's port refuses connections  2. a request on the listened port of a
    service that does not exist: 404 at once, never held  3. the first service's port leaves the
    map: it closes, and the second one is listened to."""
    ghost, other = sorted(stand_ins.assign(kube, f"{NS}/ghost/http", f"{NS}/other/http"))
    kube.ports = {str(ghost): f"{NS}/ghost/http", str(other): f"{NS}/other/http"}  # (the lower port wins)
    async with stand_ins.activator(kube.url, "--max-services", "1") as act:
        await stand_ins.wait_listening(act.admin_port, {str(ghost): f"{NS}/ghost/http"})
        warning = await act.wait_event("activator.max_services")
        assert warning["not_listened"] == [f"{NS}/other/http"]
        with pytest.raises(ConnectionRefusedError):
            await Client.send(other, "/hold")

        status, _, body = await (await Client.send(ghost, "/hold")).answer(timeout=3.0)
        assert status == 404 and b"service_not_found" in body and b"ghost" not in body
        assert await held(act.admin_port, f"{NS}/ghost") == 0

        kube.ports = {str(other): f"{NS}/other/http"}
        await stand_ins.wait_listening(act.admin_port, kube.ports)
        with pytest.raises(ConnectionRefusedError):
            await Client.send(ghost, "/hold")


async def test_a_websocket_handshake_is_held_then_relayed(kube, model, pod) -> None:
    kube.services[(NS, NAME)] = fake_kube.modelservice(port=pod.port)
    [port] = stand_ins.assign(kube, HTTP)
    async with stand_ins.listening(kube) as act, aiohttp.ClientSession() as session:
        connect = asyncio.ensure_future(session.ws_connect(f"http://127.0.0.1:{port}/ws"))
        await wait_held(act.admin_port, 1)
        assert not connect.done()
        kube.pods = [fake_kube.pod(POD_IP, "llama-0")]
        socket = await asyncio.wait_for(connect, 10.0)
        await socket.send_str("hello")
        message = await asyncio.wait_for(socket.receive(), 5.0)
        assert message.data == "echo:hello"
        await socket.close()


async def test_at_closing_a_relayed_websocket_session_gets_1001_on_both_sides(kube, model, pod) -> None:
    """1. a WebSocket session relayed to the pod  2. SIGTERM, the session quiet. Result: once quiet
    for the quiet period (the router's default, idle), the client gets Close 1001, the model
    server's side sees 1001 (the closing handshake done through the pod's router), and the activator
    exits 0."""
    kube.services[(NS, NAME)] = fake_kube.modelservice(port=pod.port)
    kube.pods = [fake_kube.pod(POD_IP, "llama-0")]
    [port] = stand_ins.assign(kube, HTTP)
    flags = ("--shutdown-drain-secs", "0", "--termination-grace-secs", "30")
    async with stand_ins.listening(kube, *flags) as act, aiohttp.ClientSession() as session:
        socket = await session.ws_connect(f"http://127.0.0.1:{port}/ws")
        await socket.send_str("hello")
        assert (await asyncio.wait_for(socket.receive(), 5.0)).data == "echo:hello"
        act.signal(signal.SIGTERM)
        message = await asyncio.wait_for(socket.receive(), 10.0)
        assert (message.type, message.data) == (aiohttp.WSMsgType.CLOSE, 1001)
        await wait_until(lambda: model.closes == [1001], 5.0, "the model server's side to see 1001")
        assert await act.wait(10.0) == 0


@pytest.mark.parametrize(("grace", "exit_code"), [("30", 0), ("3", 1)], ids=["once-quiet", "at-the-deadline"])
async def test_every_ports_websocket_sessions_get_1001_on_both_sides(kube, model, pod, grace, exit_code) -> None:
    """1. two services, each on its own port, one session relayed on each; the model server's side
    of the higher port's session (its listener opened second) answers a Close 0.5 s late  2. SIGTERM,
    the sessions quiet. Result: both clients get Close 1001 and answer it, the model server's side of
    both sees 1001 (its late answer still found the activator there to relay it, else 1006), and the
    activator exits.

    Grace 30: every port's sessions get the 1001 once quiet for the quiet period (3 s); the drain
    ends with their closing handshakes: exit 0. Grace 3: the deadline (SIGTERM + 1 s) comes first,
    sends the 1001s and ends the drain at once (exit 1); the process then waits for the closing
    handshakes of every port's sessions, not only the first port's."""
    kube.services[(NS, NAME)] = fake_kube.modelservice(port=pod.port)
    kube.services[(NS, OTHER)] = fake_kube.modelservice(port=pod.port, name=OTHER)
    kube.pods = [fake_kube.pod(POD_IP, "model-0")]  # (no labels: a pod of both services)
    first, second = sorted(stand_ins.assign(kube, HTTP, f"{NS}/{OTHER}/http"))
    flags = ("--shutdown-drain-secs", "0", "--termination-grace-secs", grace)
    async with stand_ins.listening(kube, *flags) as act:
        clients = [
            await stand_ins.WsClient.connect(first, "/ws"),
            await stand_ins.WsClient.connect(second, "/ws?close_wait=0.5"),
        ]
        for client in clients:
            client.send_frame(TEXT, b"hello")
            assert await client.read_frame() == (TEXT, b"echo:hello")
        act.signal(signal.SIGTERM)
        for client in clients:
            assert await client.read_frame() == (CLOSE, GOING_AWAY)
            client.send_frame(CLOSE, GOING_AWAY)
        await wait_until(lambda: len(model.closes) == 2, 5.0, "both sessions ended on the model server's side")
        assert model.closes == [1001, 1001]
        assert await act.wait(10.0) == exit_code


async def test_sigterm_answers_held_requests_503_and_exits(kube) -> None:
    """1. one request held  2. SIGTERM: /readyz 503 in the drain window  3. closing: the held request
    gets 503, Retry-After, Connection: close  4. exit 0."""
    kube.services[(NS, NAME)] = fake_kube.modelservice(port=1)
    [port] = stand_ins.assign(kube, HTTP)
    async with stand_ins.listening(kube, "--shutdown-drain-secs", "1") as act:
        client = await Client.send(port, "/hold?id=a")
        await wait_held(act.admin_port, 1)
        act.signal(signal.SIGTERM)
        async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{act.admin_port}/readyz") as resp:
            assert resp.status == 503
        status, headers, _ = await client.answer(timeout=5.0)
        assert status == 503 and headers["connection"] == "close" and int(headers["retry-after"]) >= 1
        assert await act.wait(10.0) == 0


async def test_a_service_gone_back_to_sleep_holds_again(kube) -> None:
    """1. forwarding to a ready pod  2. its router no longer ready, no pod listed: new requests are
    held again  3. a ready pod again: the held request is forwarded."""
    async with stand_ins.recording_pod() as pod:
        kube.services[(NS, NAME)] = fake_kube.modelservice(port=pod.port)
        kube.pods = [fake_kube.pod(POD_IP, "llama-0")]
        [port] = stand_ins.assign(kube, HTTP)
        async with stand_ins.listening(kube) as act:
            status, _, body = await (await Client.send(port, "/hold?id=a")).answer()
            assert (status, body_id(body)) == (200, "a")
            pod.ready, kube.pods = False, []
            await act.wait_event("activator.holding")
            late = await Client.send(port, "/hold?id=b")
            await wait_held(act.admin_port, 1)
            polls = len(kube.selectors)
            await wait_until(lambda: len(kube.selectors) >= polls + 2, 5.0, "two more polls of the pods")
            assert pod.model.arrived == ["a"], "forwarded with no ready pod"
            pod.ready, kube.pods = True, [fake_kube.pod(POD_IP, "llama-1")]
            status, _, body = await late.answer()
            assert (status, body_id(body)) == (200, "b")
            assert (await stand_ins.metric(act.admin_port, "drain_router_activations_total"))[()] == 2


async def test_sigterm_lets_what_is_forwarded_finish(kube) -> None:
    """1. a slow request forwarded, another service's request held  2. SIGTERM (no drain window):
    the held one gets 503 at once, the forwarded one its whole answer  3. exit 0."""
    async with stand_ins.recording_pod() as pod:
        kube.services[(NS, NAME)] = fake_kube.modelservice(port=pod.port)
        kube.services[(NS, "sleeper")] = fake_kube.modelservice(port=1, name="sleeper")
        kube.pods = [fake_kube.pod(POD_IP, "llama-0", labels={"app": NAME, "tier": "model"})]
        port, sleeper = stand_ins.assign(kube, HTTP, f"{NS}/sleeper/http")
        async with stand_ins.listening(kube) as act:
            slow = await Client.send(port, "/hold?id=slow&wait=1.5")
            await wait_until(lambda: pod.model.arrived, 5.0, "the slow request forwarded")
            sleeping = await Client.send(sleeper, "/hold?id=z")
            await wait_held(act.admin_port, 1, service=f"{NS}/sleeper")
            act.signal(signal.SIGTERM)
            status, headers, _ = await sleeping.answer(timeout=1.0)
            assert status == 503 and headers["connection"] == "close"
            status, _, body = await slow.answer(timeout=5.0)
            assert (status, body_id(body)) == (200, "slow")
            assert await act.wait(10.0) == 0


async def test_a_port_it_cannot_bind_is_not_listed(kube) -> None:
    """1. the map assigns two ports, one of them taken by another process  2. /admin/ports lists the
    other one only (the controller must not send a connection to a port the activator has not
    opened), and the failure is logged with the port."""
    taken, free = stand_ins.assign(kube, HTTP, f"{NS}/other/http")
    blocker = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", taken)
    try:
        async with stand_ins.activator(kube.url) as act:
            failed = await act.wait_event("activator.port_bind_failed")
            assert failed["port"] == taken
            await stand_ins.wait_listening(act.admin_port, {str(free): f"{NS}/other/http"})
    finally:
        blocker.close()
