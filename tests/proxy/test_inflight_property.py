"""In-flight is exact: a property test over random mixes of request fates.

For any mix of completed, slow, client-aborted (mid-stream or during a silent prefill),
upstream-failed, oversized and rejected requests, started with random offsets, the in-flight count
never goes negative, every request is counted exactly once in requests_total, and the count
returns to exactly 0 when traffic stops.
"""

from __future__ import annotations

import asyncio

import aiohttp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from drain_router import config
from drain_router.runtime import lifecycle
from drain_router_dev.fake_model import testing as fake_model_testing
from drain_router_dev.process import wait_until
from tests.blackbox import outcomes_in

KINDS = ("completed", "slow", "abort_mid_stream", "abort_in_prefill", "upstream_cut", "oversized", "upgrade")
EXPECTED_OUTCOME = {
    "completed": "completed",
    "slow": "completed",
    "abort_mid_stream": "client_aborted",
    "abort_in_prefill": "client_aborted",
    "upstream_cut": "upstream_error",
    "oversized": "rejected",
    "upgrade": "rejected",
}
BODY_LIMIT = 4096

request_plan = st.lists(
    st.tuples(st.sampled_from(KINDS), st.floats(min_value=0, max_value=0.05), st.floats(min_value=0, max_value=0.05)),
    min_size=1,
    max_size=25,
)


async def _one(
    session: aiohttp.ClientSession,
    fake: fake_model_testing.FakeModel,
    base: str,
    kind: str,
    offset: float,
    abort_after: float,
    index: int,
) -> None:
    await asyncio.sleep(offset)
    if kind == "completed":
        async with session.get(f"{base}/sse?n=3&iv=0") as resp:
            await resp.read()
    elif kind == "slow":
        async with session.get(f"{base}/sse?n=4&iv=0.02") as resp:
            await resp.read()
    elif kind in ("abort_mid_stream", "abort_in_prefill"):
        first = 5 if kind == "abort_in_prefill" else 0
        request = asyncio.ensure_future(_read(session, f"{base}/sse?n=100000&iv=0.01&first={first}&id={index}"))
        # Abort only once the request is really in flight (it reached the model server).
        await wait_until(lambda: str(index) in fake.seen_ids, 5, f"request {index} upstream")
        await asyncio.sleep(abort_after)
        request.cancel()
        try:
            await request
        except asyncio.CancelledError:
            pass
    elif kind == "upstream_cut":
        async with session.get(f"{base}/cut?n=2") as resp:
            try:
                await resp.read()
            except aiohttp.ClientPayloadError:
                pass
    elif kind == "oversized":
        async with session.post(f"{base}/echo", data=b"x" * (BODY_LIMIT + 1)) as resp:
            assert resp.status == 413
    elif kind == "upgrade":
        # (A WebSocket Upgrade is forwarded, or a 400 when not a valid handshake: another token is 501.)
        async with session.get(f"{base}/ws", headers={"Connection": "Upgrade", "Upgrade": "h2c"}) as resp:
            assert resp.status == 501


async def _read(session: aiohttp.ClientSession, url: str) -> bytes:
    # force_close: cancelling drops the TCP connection, as a departing client does
    async with session.get(url) as resp:
        return await resp.read()


async def _scenario(plan: list[tuple[str, float, float]]) -> None:
    async with fake_model_testing.running() as fake:
        cfg = config.build_config(
            upstream=fake.url,
            host="127.0.0.1",
            port=0,
            admin_host="127.0.0.1",
            admin_port=0,
            shutdown_drain_secs=0,
            max_request_body_bytes=BODY_LIMIT,
        )
        registry = CollectorRegistry()
        router = lifecycle.Router(cfg, registry=registry)
        task = asyncio.ensure_future(router.run(install_signals=False))
        await asyncio.wait_for(router.started.wait(), 5)
        base = f"http://127.0.0.1:{router.port}"
        lowest = []

        async def sample() -> None:
            while True:
                lowest.append(registry.get_sample_value("drain_router_inflight_requests"))
                await asyncio.sleep(0.002)

        sampler = asyncio.ensure_future(sample())
        connector = aiohttp.TCPConnector(limit=0, force_close=True)
        async with aiohttp.ClientSession(connector=connector) as session:
            await asyncio.gather(*(_one(session, fake, base, *item, index=i) for i, item in enumerate(plan)))
        await wait_until(lambda: len(router.state.inflight) == 0, 5, "in-flight back to exactly 0")
        sampler.cancel()
        assert min(lowest) >= 0
        assert registry.get_sample_value("drain_router_inflight_requests") == 0
        counted = outcomes_in(registry)
        expected: dict[str, float] = {}
        for kind, _, _ in plan:
            expected[EXPECTED_OUTCOME[kind]] = expected.get(EXPECTED_OUTCOME[kind], 0) + 1
        assert counted == expected
        router.handle_exit(15)
        assert await asyncio.wait_for(task, 5) == 0


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plan=request_plan)
def test_inflight_is_exact_for_any_mix(plan: list[tuple[str, float, float]]) -> None:
    asyncio.run(_scenario(plan))
