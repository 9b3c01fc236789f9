"""``drain-router front``, black-box: how it uses a service's pods, with real processes (fake model
servers behind real routers, a real front) and, where an exact answer is needed, stand-in pods the
test plays byte for byte.

1. Spread: concurrent streams split evenly over two pods; a pod with a request in flight gets no new
   one while the other is idle (in-flight count, not turns).
2. Leaving: a pod whose router says ``Connection: close`` (SIGTERM with a drain window) is left at
   that answer: every new request goes to the other pod, with no probe in between; a pod whose
   ``/readyz`` turns 503 gets nothing new.
3. Retries: an answer with the refusal mark is retried once on another pod (the client gets that
   pod's answer, the retry counted by reason); a 429 with the mark, and a 503 without it, are
   relayed as they are; with every pod refusing, the client gets the second refusal; a pod whose
   port refuses connections is left and the request retried (``connect_failed``).
4. Holding: with no pod ready a request is held until one is, answered 503 with ``Retry-After``
   past ``--queue-timeout-secs``, and 429 past ``--queue-size``.
5. ``--service``: the pods are the ready endpoints of the ModelService's Services' EndpointSlices
   (the activator's slice ignored); with none, a request is held, a wake asked for once on the
   ModelService's status, and the request served once an endpoint is listed.
"""

from __future__ import annotations

import asyncio
import signal
import time
from typing import Any

import pytest

from drain_router_dev import fake_kube
from drain_router_dev.process import free_port, wait_until
from tests.front.rig import Pod, Rig, answer, metric, model_stats, post, wait_metric
from tests.process import RouterProcess

RETRIES = "drain_router_front_retries_total"
HELD = "drain_router_front_held_requests"


def streaming(tokens: int = 3000) -> dict[str, Any]:
    """A stream that runs until the test is over (a minute)."""
    return {"model": "m", "prompt": "Count:", "stream": True, "max_tokens": tokens, "interval_ms": 20}


SHORT = {"model": "m", "prompt": "Hi", "max_tokens": 2, "interval_ms": 0}


async def started(*pods: Pod) -> list[int]:
    """Requests each pod's model server has taken so far."""
    return [(await model_stats(pod.model))["started"] for pod in pods]


async def active(*pods: Pod) -> list[int]:
    return [(await model_stats(pod.model))["active"] for pod in pods]


async def short(front: RouterProcess, count: int = 1) -> None:
    """``count`` short requests through the front, one after the other, each answered 200."""
    assert front.port is not None
    for _ in range(count):
        got = await post(front.port, "/v1/completions", SHORT)
        assert got.status == 200, got.raw


# -- 1. spread ------------------------------------------------------------------------------------


async def test_requests_go_to_the_pod_with_the_fewest_in_flight() -> None:
    """One stream in flight on a pod: the next requests, one at a time, all go to the idle pod (taking
    turns would send every other one to the busy pod); then five streams at once split so that each
    pod carries three."""
    async with Rig() as rig:
        pods = await rig.pods(2)
        front = await rig.front(*pods)
        assert front.port is not None
        streams = [asyncio.ensure_future(post(front.port, "/v1/completions", streaming()))]
        try:
            busy = await wait_until(lambda: active(*pods), 10, "one stream generating", until=lambda a: sum(a) == 1)
            await short(front, 6)
            assert await started(*pods) == ([1, 6] if busy == [1, 0] else [6, 1])
            streams += [asyncio.ensure_future(post(front.port, "/v1/completions", streaming())) for _ in range(5)]
            await wait_until(lambda: active(*pods), 10, "six streams generating", until=lambda a: sum(a) == 6)
            assert await active(*pods) == [3, 3]
        finally:
            for task in streams:
                task.cancel()


# -- 2. leaving -----------------------------------------------------------------------------------


async def test_a_pod_is_left_at_its_routers_first_connection_close_without_a_probe() -> None:
    """One probe only (at start): the pod whose router drains (SIGTERM, a 30 s window: it still
    serves, with ``Connection: close`` on every answer) is left at its first such answer, and every
    later request goes to the other pod."""
    async with Rig() as rig:
        draining, other = await asyncio.gather(rig.pod(drain_secs="30"), rig.pod())
        front = await rig.front(draining, other, poll_interval_secs=3600)
        draining.router.signal(signal.SIGTERM)
        await draining.router.wait_event("drain.start")
        # Equal pods take turns: one of the next two requests goes to the draining pod.
        for _ in range(2):
            await short(front)
            if (await started(draining))[0]:
                break
        assert (await started(draining))[0] == 1
        leaving = await front.wait_event("front.pod_leaving")
        assert leaving["pod"] == draining.url
        before = (await started(other))[0]
        await short(front, 10)
        assert await started(draining, other) == [1, before + 10]
        assert await metric(front, "drain_router_front_ready_pods") == 1
        # Never probed since the start: left at the answer, not at /readyz.
        assert "front.pod_not_ready" not in front.names()


async def test_a_pod_whose_readyz_turns_503_gets_nothing_new() -> None:
    async with Rig() as rig:
        leaving, other = await rig.stand_in(), await rig.stand_in()
        front = await rig.front(leaving, other)
        leaving.ready = False
        event = await front.wait_event("front.pod_not_ready")
        assert event["pod"] == leaving.url
        await short(front, 10)
        assert (len(leaving.seen), len(other.seen)) == (0, 10)


# -- 3. retries -----------------------------------------------------------------------------------

REFUSED = "x-drain-router-refused"


async def test_a_refused_request_is_retried_on_another_pod() -> None:
    async with Rig() as rig:
        refusing = await rig.stand_in()  # listed first: the first request goes to it
        refusing.answers = [answer(503, ((REFUSED, "closing"),), b'{"error": "closing"}')]
        real = await rig.pod()
        front = await rig.front(refusing, real)
        await short(front)
        assert len(refusing.seen) == 1
        assert await started(real) == [1]
        assert await metric(front, RETRIES, reason="closing") == 1
        event = await front.wait_event("front.retry")
        assert (event["reason"], event["pod"], event["to"]) == ("closing", refusing.url, real.url)


@pytest.mark.parametrize(
    ("status", "headers", "body"),
    [
        # A full pod: a retry would multiply the overload it reports.
        (429, ((REFUSED, "queue_full"), ("retry-after", "1")), b"full"),
        # The model server's own 503: it saw the request.
        (503, (("retry-after", "1"),), b"engine overloaded"),
    ],
    ids=["429-with-the-mark", "503-without-the-mark"],
)
async def test_an_answer_that_is_no_refusal_to_retry_is_relayed(
    status: int, headers: tuple[tuple[str, str], ...], body: bytes
) -> None:
    async with Rig() as rig:
        answering, other = await rig.stand_in(), await rig.stand_in()
        answering.answers = [answer(status, headers, body)]
        front = await rig.front(answering, other)
        assert front.port is not None
        got = await post(front.port, "/v1/completions", SHORT)
        assert (got.status, got.raw, got.headers.get("Retry-After")) == (status, body, "1")
        # The pod's router's mark is kept for a tier above the front; none is made up.
        assert got.headers.get(REFUSED) == dict(headers).get(REFUSED)
        assert (len(answering.seen), len(other.seen)) == (1, 0)
        assert await metric(front, RETRIES, reason="queue_full") == 0


async def test_a_request_is_retried_once_only() -> None:
    """Both pods refuse: the client gets the second refusal as it was, and one retry is counted."""
    async with Rig() as rig:
        first, second = await rig.stand_in(), await rig.stand_in()
        first.answers = [answer(503, ((REFUSED, "closing"),), b"first")]
        second.answers = [answer(502, ((REFUSED, "upstream_unavailable"),), b"second")]
        front = await rig.front(first, second)
        assert front.port is not None
        got = await post(front.port, "/v1/completions", SHORT)
        assert (got.status, got.raw) == (502, b"second")
        assert got.headers.get(REFUSED) == "upstream_unavailable"
        assert (len(first.seen), len(second.seen)) == (1, 1)
        assert first.seen[0].body == second.seen[0].body  # the same request, sent again
        assert await metric(front, RETRIES, reason="closing") == 1
        assert await metric(front, RETRIES, reason="upstream_unavailable") == 0


async def test_a_pod_that_cannot_be_connected_to_is_left_and_the_request_retried() -> None:
    """The stand-in answered the front's one probe ready, then closed its listener: the request's
    connection is refused, the pod left, and the request sent to the other pod."""
    async with Rig() as rig:
        gone, other = await rig.stand_in(), await rig.stand_in()
        front = await rig.front(gone, other, poll_interval_secs=3600)
        await gone.stop_listening()
        await short(front)
        assert len(other.seen) == 1
        assert await metric(front, RETRIES, reason="connect_failed") == 1
        assert (await front.wait_event("front.pod_leaving"))["pod"] == gone.url
        assert await metric(front, "drain_router_front_ready_pods") == 1


# -- 4. holding -----------------------------------------------------------------------------------


async def test_a_request_is_held_until_a_pod_is_ready() -> None:
    async with Rig() as rig:
        port = free_port()
        front, model = await asyncio.gather(
            rig.front(f"http://127.0.0.1:{port}", ready=0, queue_timeout_secs=30), rig.model()
        )
        assert front.port is not None
        held = asyncio.ensure_future(post(front.port, "/v1/completions", SHORT))
        await wait_metric(front, HELD, 1)
        assert not held.done()
        await rig.router(model.url, "--port", str(port))
        got = await asyncio.wait_for(held, 20)
        assert got.status == 200, got.raw
        assert (await model_stats(model))["started"] == 1
        assert await metric(front, HELD) == 0


async def test_a_request_held_past_the_queue_timeout_gets_503_with_retry_after() -> None:
    async with Rig() as rig:
        front = await rig.front(f"http://127.0.0.1:{free_port()}", ready=0, queue_timeout_secs=0.5)
        assert front.port is not None
        sent = time.monotonic()
        got = await post(front.port, "/v1/completions", SHORT)
        assert time.monotonic() - sent >= 0.5
        assert got.status == 503 and "Retry-After" in got.headers, got
        assert got.headers.get("x-drain-router-refused") == "queue_timeout"


async def test_a_request_past_the_queue_size_gets_429() -> None:
    async with Rig() as rig:
        front = await rig.front(f"http://127.0.0.1:{free_port()}", ready=0, queue_size=1, queue_timeout_secs=30)
        assert front.port is not None
        held = asyncio.ensure_future(post(front.port, "/v1/completions", SHORT))
        try:
            await wait_metric(front, HELD, 1)
            got = await post(front.port, "/v1/completions", SHORT)
            assert got.status == 429 and "Retry-After" in got.headers, got
            assert got.headers.get("x-drain-router-refused") == "queue_full"
            assert not held.done()
        finally:
            held.cancel()


# -- 5. --service ---------------------------------------------------------------------------------

SERVICE = "llama-svc"


def _modelservice(port: int) -> dict[str, Any]:
    """The ModelService whose workload lists the Service :data:`SERVICE`, its routers on ``port``."""
    obj: dict[str, Any] = fake_kube.modelservice(port=port)
    obj["spec"]["workload"] = [
        {"apiVersion": "apps/v1", "kind": "Deployment", "name": "llama"},
        {"apiVersion": "v1", "kind": "Service", "name": SERVICE},
    ]
    return obj


async def _pod_at(rig: Rig, host: str, port: int) -> Pod:
    """A fake model and its router on ``host:port`` (a loopback address of its own)."""
    model = await rig.model()
    return Pod(model, await rig.router(model.url, "--host", host, "--port", str(port)))


async def test_with_service_the_pods_are_the_endpointslices_ready_endpoints() -> None:
    async with Rig() as rig, fake_kube.kube_api() as kube:
        port = free_port()
        pods = await asyncio.gather(_pod_at(rig, "127.0.0.2", port), _pod_at(rig, "127.0.0.3", port))
        # The activator's endpoint (a sleeping service's): ready, and never to be used.
        activator = await rig.stand_in("127.0.0.4", port)
        kube.services[(fake_kube.NS, fake_kube.NAME)] = _modelservice(port)
        kube.endpointslices += [
            fake_kube.endpointslice(SERVICE, ["127.0.0.2", "127.0.0.3"]),
            fake_kube.endpointslice(SERVICE, ["127.0.0.4"], name="activator", managed_by="drain-router.dev"),
            fake_kube.endpointslice("other-svc", ["127.0.0.4"]),
        ]
        front = await rig.front(ready=2, service=f"{fake_kube.NS}/{fake_kube.NAME}", kube_api=kube.url)
        await short(front, 4)
        assert sorted(await started(*pods)) == [2, 2]
        assert activator.seen == []
        assert await metric(front, "drain_router_front_ready_pods") == 2


async def test_with_service_and_no_endpoint_a_wake_is_asked_for_once() -> None:
    async with Rig() as rig, fake_kube.kube_api() as kube:
        port = free_port()
        kube.services[(fake_kube.NS, fake_kube.NAME)] = _modelservice(port)
        kube.endpointslices.append(
            fake_kube.endpointslice(SERVICE, ["127.0.0.4"], name="activator", managed_by="drain-router.dev")
        )
        front, pod = await asyncio.gather(
            rig.front(ready=0, service=f"{fake_kube.NS}/{fake_kube.NAME}", kube_api=kube.url, queue_timeout_secs=30),
            _pod_at(rig, "127.0.0.2", port),  # not listed yet
        )
        assert front.port is not None
        held = asyncio.ensure_future(post(front.port, "/v1/completions", SHORT))
        await wait_metric(front, HELD, 1)
        await wait_until(lambda: kube.patches, 10, "a status patch")
        # Five more polls: the wake is pending (asked for, not answered), so none asks again.
        reads = kube.reads
        await wait_until(lambda: kube.reads, 10, "five more polls", until=lambda n: n >= reads + 5)
        assert len(kube.patches) == 1
        _, patch, code = kube.patches[0]
        assert code == 200 and "wakeRequestedAt" in patch["status"]["lifecycle"]
        assert not held.done()
        # The service wakes: its pod is listed.
        kube.endpointslices.append(fake_kube.endpointslice(SERVICE, ["127.0.0.2"]))
        got = await asyncio.wait_for(held, 20)
        assert got.status == 200, got.raw
        assert await started(pod) == [1]
        assert len(kube.patches) == 1
