"""Admission control on the HTTP/1.1 listener, black-box: a real router process with
``--max-concurrent-requests``, raw client sockets, and a model server that holds each request until
the test lets it go (:mod:`tests.heldupstream`: what arrived, in which order, the most at once).

1. The model server never holds more than N; the rest wait first in, first out.
2. A full queue answers 429, a wait past ``--queue-timeout-secs`` 503; both with ``Retry-After``,
   ``retry-after-ms`` and ``x-drain-router-refused``; neither reaches the model server; counted
   ``rejected`` and by reason.
3. Health and model listing never wait; the router's own endpoints never do.
4. At closing every request still queued gets 503 with ``Connection: close`` at once, in-flight
   ones finish; counted ``rejected``, never ``deadline_aborted``.
5. A client that leaves the queue frees its place at once.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import AsyncIterator

import pytest

from drain_router_dev.process import wait_until
from tests import heldupstream
from tests.blackbox import RawClient, by_outcome, inflight, metric_samples, requests_total, reset
from tests.process import RouterProcess, Start, router_starter


@pytest.fixture
async def held() -> AsyncIterator[heldupstream.HeldUpstream]:
    async with heldupstream.running() as up:
        yield up


@pytest.fixture(autouse=True)
async def close_clients() -> AsyncIterator[None]:
    yield
    await RawClient.close_all()


@pytest.fixture
async def start_process(held) -> AsyncIterator[Start]:
    async with router_starter(held.url) as start:
        yield start


def limits(n: int, q: int, t: float = 30) -> tuple[str, ...]:
    return ("--max-concurrent-requests", str(n), "--queue-size", str(q), "--queue-timeout-secs", str(t))


class Client(RawClient):
    @classmethod
    async def send(cls, port: int, target: str, method: str = "GET") -> Client:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(f"{method} {target} HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n".encode())
        await writer.drain()
        return cls(reader, writer)


async def counts(router: RouterProcess) -> dict[str, object]:
    assert router.admin_port is not None
    return await inflight(router.admin_port)


async def wait_counts(router: RouterProcess, inflight_: int, queued: int, timeout: float = 5.0) -> None:
    async def now() -> tuple[object, object]:
        report = await counts(router)
        return report["inflight"], report["queued"]

    await wait_until(now, timeout, f"inflight {inflight_}, queued {queued}", until=lambda v: v == (inflight_, queued))


async def metric(router: RouterProcess, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    assert router.admin_port is not None
    return await metric_samples(router.admin_port, name)


async def rejections(router: RouterProcess) -> dict[str, float]:
    return {dict(k)["reason"]: v for k, v in (await metric(router, "drain_router_admission_rejections_total")).items()}


def assert_retry_headers(headers: dict[str, str]) -> None:
    seconds, ms = int(headers["retry-after"]), int(headers["retry-after-ms"])
    assert seconds >= 1
    assert ms >= 1000
    assert seconds * 1000 >= ms > (seconds - 1) * 1000  # the same wait, rounded up to whole seconds


async def queue_up(router: RouterProcess, ids: list[str], *, held_before: int = 0, n: int) -> list[Client]:
    """One request per id, each sent once the one before is counted (in flight or queued), so the
    order they reached the router is the order of ``ids``."""
    assert router.port is not None
    clients = []
    for i, rid in enumerate(ids, start=1):
        clients.append(await Client.send(router.port, f"/hold?id={rid}", "POST"))
        total = held_before + i
        await wait_counts(router, min(total, n), max(0, total - n))
    return clients


async def test_never_more_than_n_in_flight_and_the_queue_is_first_in_first_out(start_process, held):
    router = await start_process(*limits(2, 10))
    ids = [str(i) for i in range(7)]
    clients = await queue_up(router, ids, n=2)
    report = await counts(router)
    assert report["queued"] == 5
    assert report["idle_since"] is None
    assert held.active == 2
    for done in range(1, len(ids) + 1):
        held.release(1)  # the oldest held answers: its slot goes to the oldest waiter
        await wait_until(lambda d=done: held.finished == d, 5, f"{done} answered")
        await wait_until(lambda d=done: len(held.arrived) == min(len(ids), d + 2), 5, "the next one forwarded")
    assert held.arrived == ids  # first in, first out
    assert held.peak == 2  # the model server never held more than N
    for client in clients:
        assert (await client.answer())[0] == 200
        client.close()
    await wait_counts(router, 0, 0)
    assert (await counts(router))["idle_since"] is not None
    waits = await metric(router, "drain_router_queue_wait_seconds_count")
    assert next(iter(waits.values())) == 5  # every request that waited, and only those


async def test_a_fractional_queue_timeout_answers_503_after_it_not_a_whole_second(start_process, held):
    """``--queue-timeout-secs 0.3`` (interactive chat wants sub-second): a request that finds the
    only slot taken is answered 503 ``queue_timeout`` about 0.3 s after it was sent, well before the
    second a timeout rounded to whole seconds would take; it never reaches the model server."""
    router = await start_process(*limits(1, 1, t=0.3))
    assert router.port is not None
    await queue_up(router, ["in-flight"], n=1)
    sent = time.monotonic()
    waiter = await Client.send(router.port, "/hold?id=waits", "POST")
    status, headers, body = await waiter.answer(timeout=5)
    elapsed = time.monotonic() - sent
    assert status == 503 and b"queue_timeout" in body
    assert_retry_headers(headers)
    # The timer starts when the router reads the request, after ``sent``: never before 0.3 s; the
    # tolerance above it is for a loaded machine, and still well short of a whole second.
    assert 0.3 <= elapsed < 0.8, f"answered {elapsed:.3f} s after it was sent"
    assert held.arrived == ["in-flight"]
    assert await rejections(router) == {"queue_full": 0, "queue_timeout": 1, "closing": 0}
    held.release(1)


async def test_full_queue_429_and_queue_timeout_503_with_retry_after(start_process, held):
    router = await start_process(*limits(1, 1, t=1))
    assert router.port is not None
    first, second = await queue_up(router, ["in-flight", "waits"], n=1)
    third = await Client.send(router.port, "/hold?id=full", "POST")
    status, headers, body = await third.answer()
    assert status == 429
    assert_retry_headers(headers)
    assert b"queue_full" in body
    assert headers["x-drain-router-refused"] == "queue_full"  # never seen by the model server: marked
    assert "connection" not in headers  # a capacity refusal keeps the connection (serving)
    status, headers, body = await second.answer(timeout=5)  # --queue-timeout-secs 1
    assert status == 503
    assert_retry_headers(headers)
    assert b"queue_timeout" in body
    assert headers["x-drain-router-refused"] == "queue_timeout"
    assert held.arrived == ["in-flight"]  # neither refused request reached the model server
    assert await rejections(router) == {"queue_full": 1, "queue_timeout": 1, "closing": 0}
    totals = await requests_total(router.admin_port)
    assert totals[("429", "rejected")] == 1
    assert totals[("503", "rejected")] == 1
    held.release_all()
    status, headers, _ = await first.answer()
    assert status == 200 and "x-drain-router-refused" not in headers  # the model server's answer
    for client in (first, second, third):
        client.close()


async def test_health_and_model_listing_never_wait(start_process, held):
    router = await start_process(*limits(1, 0), "--upstream-health-path", "/health")
    assert router.port is not None
    (busy,) = await queue_up(router, ["busy"], n=1)
    for path in ("/health", "/v1/models", "/livez", "/readyz"):
        client = await Client.send(router.port, path)
        status, _, _ = await client.answer()
        assert status == 200, path
        client.close()
    refused = await Client.send(router.port, "/v1/models", "POST")  # only reads are exempt
    assert (await refused.answer())[0] == 429
    refused.close()
    held.release_all()
    assert (await busy.answer())[0] == 200
    busy.close()


async def test_at_closing_queued_requests_get_503_and_close_in_flight_ones_finish(start_process, held):
    router = await start_process(*limits(1, 5), drain_secs="1")
    in_flight, *waiting = await queue_up(router, ["in-flight", "q1", "q2"], n=1)
    router.signal(signal.SIGTERM)
    await router.wait_event("drain.start")
    assert (await counts(router))["queued"] == 2  # through the drain window the queue works as usual
    await router.wait_event("drain.closing")
    for client in waiting:
        status, headers, body = await client.answer(timeout=2)
        assert status == 503
        assert headers["connection"] == "close"
        assert_retry_headers(headers)
        assert b"closing" in body
        assert headers["x-drain-router-refused"] == "closing"
        assert await client.closed()
    assert held.arrived == ["in-flight"]  # the queued ones never reached the model server
    await wait_counts(router, 1, 0)
    assert await rejections(router) == {"queue_full": 0, "queue_timeout": 0, "closing": 2}
    outcomes = by_outcome(await requests_total(router.admin_port))
    assert outcomes.get("rejected") == 2
    assert "deadline_aborted" not in outcomes
    held.release_all()
    assert (await in_flight.answer())[0] == 200  # in flight at closing: finished as usual
    assert await router.wait(10) == 0


async def test_clients_that_leave_the_queue_free_their_place_at_once(start_process, held):
    router = await start_process(*limits(1, 3))
    assert router.port is not None
    busy, rst, fin, stays = await queue_up(router, ["busy", "rst", "fin", "stays"], n=1)
    reset(rst.writer)  # vanishes hard
    fin.close()  # vanishes politely
    await wait_counts(router, 1, 1, timeout=2)  # well before --queue-timeout-secs
    more = await queue_up(router, ["late1", "late2"], held_before=2, n=1)  # their places are free again
    held.release_all()
    for client in (busy, stays, *more):
        assert (await client.answer())[0] == 200
        client.close()
    assert held.arrived == ["busy", "stays", "late1", "late2"]
    outcomes = by_outcome(await requests_total(router.admin_port))
    assert outcomes.get("client_aborted") == 2
    await wait_counts(router, 0, 0)
