"""``GET /engine/metrics`` of a real router process: the model server's metrics relayed as they are,
never counted (``served``, ``idle_since``, ``requests_total`` do not move), bounded in size, time
and concurrency, 404 when ``--engine-metrics-path`` is empty.

The misbehaving upstreams are raw socket servers in the test's loop: one that streams a body
forever, one that trickles it, one that never answers; each counts the connections it accepted.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from drain_router.runtime import engine_metrics
from drain_router_dev.fake_model import app as fake_app
from drain_router_dev.fake_model import testing as fake_model_testing
from tests.blackbox import requests_total
from tests.process import RouterProcess, Start, router_starter

SCRAPE_EVERY_SECS = 0.1
SCRAPE_FOR_SECS = 10.0


@pytest.fixture
async def start(fake_upstream: fake_model_testing.FakeModel) -> AsyncIterator[Start]:
    async with router_starter(fake_upstream.url) as start:
        yield start


async def get(router: RouterProcess, path: str, *, admin: bool = True) -> tuple[int, str | None, bytes]:
    port = router.admin_port if admin else router.port
    async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{port}{path}") as resp:
        return resp.status, resp.headers.get("Content-Type"), await resp.read()


async def inflight(router: RouterProcess) -> dict[str, Any]:
    async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{router.admin_port}/admin/inflight") as resp:
        body: dict[str, Any] = await resp.json()
        return body


async def test_scraped_every_100ms_for_10s_nothing_counts(start, fake_upstream):
    """1. one proxied request, so ``served`` is 1 and ``idle_since`` is set 2. /admin/inflight and
    requests_total read 3. /engine/metrics scraped every 100 ms for 10 s, each 200 with the engine's
    body and Content-Type as they are. Result: ``served``, ``idle_since`` and requests_total as
    before; the model server answered every scrape."""
    router = await start()
    status, _, _ = await get(router, "/v1/models", admin=False)
    assert status == 200
    before, counted = await inflight(router), await requests_total(router.admin_port)
    assert before["served"] == 1 and before["idle_since"] is not None

    scrapes = 0
    loop = asyncio.get_running_loop()
    end = loop.time() + SCRAPE_FOR_SECS
    async with aiohttp.ClientSession() as s:
        while loop.time() < end:
            async with s.get(f"http://127.0.0.1:{router.admin_port}/engine/metrics") as resp:
                body = await resp.read()
                assert resp.status == 200, body
                assert resp.headers["Content-Type"] == fake_app.METRICS_CONTENT_TYPE
                assert b'vllm:num_requests_running{model_name="' in body
                assert f"fake_model_metrics_scrapes_total {scrapes + 1}\n".encode() in body
            scrapes += 1
            await asyncio.sleep(SCRAPE_EVERY_SECS)

    after = await inflight(router)
    assert scrapes >= 50
    assert fake_upstream.metrics_scrapes == scrapes
    assert (after["served"], after["idle_since"], after["inflight"]) == (before["served"], before["idle_since"], 0)
    assert await requests_total(router.admin_port) == counted

    # The same scrape through the traffic port is a proxied request: it counts, and restarts the clock.
    status, _, _ = await get(router, "/metrics", admin=False)
    assert status == 200
    traffic = await inflight(router)
    assert traffic["served"] == before["served"] + 1 and traffic["idle_since"] != before["idle_since"]


async def test_a_unix_socket_upstream(tmp_path: Path):
    """The relay reaches the model server over the same address as the traffic path: a Unix socket."""
    async with (
        fake_model_testing.running(unix_path=tmp_path / "model.sock") as fake,
        router_starter(fake.url) as start,
    ):
        router = await start()
        status, content_type, body = await get(router, "/engine/metrics")
        assert (status, content_type) == (200, fake_app.METRICS_CONTENT_TYPE)
        assert b"vllm:num_requests_waiting" in body and fake.metrics_scrapes == 1


async def test_disabled_is_404_and_never_reaches_the_model(start, fake_upstream):
    router = await start("--engine-metrics-path", "")
    status, content_type, body = await get(router, "/engine/metrics")
    assert (status, content_type) == (404, "application/json")
    assert b"engine_metrics_disabled" in body
    assert fake_upstream.metrics_scrapes == 0


async def test_an_error_answer_is_a_static_502(start, fake_upstream):
    router = await start("--engine-metrics-path", "/status/500")
    status, _, body = await get(router, "/engine/metrics")
    assert status == 502 and b"engine_metrics_unavailable" in body
    assert b"127.0.0.1" not in body


# -- misbehaving upstreams ------------------------------------------------------------------------

Serve = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@contextlib.asynccontextmanager
async def raw_upstream(serve: Serve) -> AsyncIterator[tuple[str, list[int]]]:
    """A raw socket server on loopback; yields (its URL, a one-item list counting connections)."""
    accepted = [0]
    held: set[asyncio.StreamWriter] = set()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted[0] += 1
        held.add(writer)
        with contextlib.suppress(ConnectionError):
            await reader.readuntil(b"\r\n\r\n")
            await serve(reader, writer)

    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", accepted
    finally:
        for writer in held:
            writer.close()
        server.close()


HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n"


async def stream_forever(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.write(HEAD)
    chunk = b"x" * 65536
    frame = b"%x\r\n" % len(chunk) + chunk + b"\r\n"
    while True:
        writer.write(frame)
        await writer.drain()


async def trickle_forever(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.write(HEAD)
    while True:
        writer.write(b"2\r\nx\n\r\n")
        await writer.drain()
        await asyncio.sleep(0.1)


async def never_answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await asyncio.Event().wait()


async def test_a_body_past_the_size_bound_is_a_static_502():
    """An upstream streaming its metrics forever: 502 ``engine_metrics_too_large`` once the bound is
    passed (long before the timeout), the body static."""
    async with raw_upstream(stream_forever) as (url, _), router_starter(url) as start:
        router = await start()
        started = time.monotonic()
        status, content_type, body = await get(router, "/engine/metrics")
        assert (status, content_type) == (502, "application/json")
        assert b"engine_metrics_too_large" in body and url.encode() not in body
        assert time.monotonic() - started < engine_metrics.ENGINE_METRICS_TIMEOUT_SECS


@pytest.mark.parametrize("serve", [never_answer, trickle_forever], ids=["never-answers", "trickles"])
async def test_no_whole_answer_in_time_is_a_504_and_one_fetch_serves_concurrent_scrapes(serve):
    """Five scrapes at once of an upstream that never finishes: one connection to it, all five 504
    ``engine_metrics_timeout`` at the timeout (not later), the body static."""
    async with raw_upstream(serve) as (url, accepted), router_starter(url) as start:
        router = await start()
        started = time.monotonic()
        answers = await asyncio.gather(*(get(router, "/engine/metrics") for _ in range(5)))
        took = time.monotonic() - started
        assert [a[0] for a in answers] == [504] * 5
        assert all(b"engine_metrics_timeout" in a[2] and url.encode() not in a[2] for a in answers)
        assert accepted[0] == 1, "concurrent scrapes share one fetch"
        assert engine_metrics.ENGINE_METRICS_TIMEOUT_SECS - 0.5 <= took < engine_metrics.ENGINE_METRICS_TIMEOUT_SECS + 3


async def test_concurrent_scrapes_of_a_slow_engine_share_its_one_answer():
    """Five scrapes at once of an engine that answers after 1.5 s: one request reaches it and all five
    get its answer (five fetches in a row, one connection at a time, would pass the timeout)."""
    answered = [0]

    async def slow_answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(1.5)
        answered[0] += 1
        body = b"engine_up 1\n"
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        await writer.drain()
        await asyncio.Event().wait()

    async with raw_upstream(slow_answer) as (url, _), router_starter(url) as start:
        router = await start()
        answers = await asyncio.gather(*(get(router, "/engine/metrics") for _ in range(5)))
        assert [(a[0], a[2]) for a in answers] == [(200, b"engine_up 1\n")] * 5
        assert answered == [1]
