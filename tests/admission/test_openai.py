"""The OpenAI SDK against a router at its admission limit: a 429 carries ``retry-after-ms``,
which the SDK honours (it waits that long rather than its own shorter backoff), and its retry
succeeds. The fake model server answers each completion after a fixed time."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import openai
import pytest

from tests.blackbox import requests_total
from tests.process import Start, router_starter

#: The SDK's own first backoff is at most 0.5 s (jittered down): a retry that waited about a second
#: waited for the router's Retry-After (at least 1 s), not for the SDK's backoff.
RETRY_AFTER_FLOOR_SECS = 1.0


@pytest.fixture
async def start_process(fake_upstream) -> AsyncIterator[Start]:
    async with router_starter(fake_upstream.url) as start:
        yield start


async def test_the_sdk_honours_retry_after_and_succeeds_on_retry(start_process, fake_upstream):
    router = await start_process("--max-concurrent-requests", "1", "--queue-size", "1")
    client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{router.port}/v1", api_key="x", max_retries=3)

    async def complete(name: str) -> tuple[str, float]:
        began = time.monotonic()
        answer = await client.chat.completions.create(
            model="fake-model",
            messages=[{"role": "user", "content": name}],
            extra_body={"chunks": 4, "interval_ms": 50},
        )
        return answer.choices[0].message.content or "", time.monotonic() - began

    try:
        results = await asyncio.gather(*(complete(str(i)) for i in range(3)))
    finally:
        await client.close()
    assert all(content for content, _ in results)  # every call succeeded
    totals = await requests_total(router.admin_port)
    refused = totals.get(("429", "rejected"), 0)
    assert refused >= 1  # one of three found the slot taken and the queue full
    assert totals[("200", "completed")] == 3
    assert fake_upstream.started == 3  # a refused attempt never reached the model server
    slowest = max(elapsed for _, elapsed in results)
    assert slowest >= RETRY_AFTER_FLOOR_SECS - 0.05  # the retry waited for Retry-After, not the SDK's backoff
