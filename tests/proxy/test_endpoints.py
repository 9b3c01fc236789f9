"""Probe, admin and metrics endpoints; probes and admin calls never count as in flight."""

from __future__ import annotations

import asyncio

from drain_router_dev.fake_model import testing as fake_model_testing
from drain_router_dev.process import wait_until


async def test_probes_on_both_listeners_metrics_admin_only(fake_upstream, start_router, http):
    r = await start_router(upstream=fake_upstream.url)
    for base in (r.url, r.admin):
        async with http.get(f"{base}/livez") as resp:
            assert resp.status == 200 and await resp.json() == {"status": "alive"}
        async with http.get(f"{base}/readyz") as resp:
            assert resp.status == 200
            body = await resp.json()
            assert body["status"] == "ready" and body["inflight"] == 0
    async with http.get(f"{r.admin}/metrics") as resp:
        assert resp.status == 200
        text = await resp.text()
    for name in (
        "drain_router_inflight_requests",
        'drain_router_state{state="serving"} 1.0',
        "drain_router_shutdown_drain_seconds 1.0",
        "drain_router_upstream_up",
        "drain_router_request_duration_seconds",
        "drain_router_time_to_first_byte_seconds",
        "process_resident_memory_bytes",
        "process_open_fds",
        "process_max_fds",
    ):
        assert name in text
    async with http.get(f"{r.url}/metrics") as resp:  # on the traffic port it is just proxied
        assert resp.status == 200
        text = await resp.text()
        assert "vllm:num_requests_running" in text, "the model server's own /metrics"
        assert "drain_router_" not in text


async def test_admin_inflight_matches_open_streams_and_ignores_probes(fake_upstream, start_router, http):
    r = await start_router(upstream=fake_upstream.url)
    async with http.get(f"{r.admin}/admin/inflight") as resp:
        idle = await resp.json()
    assert idle["inflight"] == 0 and idle["state"] == "serving"
    assert idle["idle_since"] is not None and idle["started_at"] <= idle["idle_since"]
    assert idle["served"] == 0, "a fresh router has served nothing"

    async def stream():
        async with http.get(f"{r.url}/sse?n=20&iv=0.05") as resp:
            await resp.read()

    tasks = [asyncio.ensure_future(stream()) for _ in range(7)]
    await wait_until(lambda: fake_upstream.started == 7, 5, "7 started upstream")
    for _ in range(3):  # probes and admin calls while busy do not add to the count
        async with http.get(f"{r.url}/readyz") as resp:
            assert (await resp.json())["inflight"] == 7
    async with http.get(f"{r.admin}/admin/inflight") as resp:
        busy = await resp.json()
    assert busy["inflight"] == 7 and busy["idle_since"] is None and busy["served"] == 0
    async with http.get(f"{r.admin}/metrics") as resp:
        assert "drain_router_inflight_requests 7.0" in await resp.text()
    await asyncio.gather(*tasks)
    async with http.get(f"{r.admin}/admin/inflight") as resp:
        after = await resp.json()
    assert after["inflight"] == 0 and after["idle_since"] >= idle["idle_since"]
    assert after["served"] == 7, "the 7 streams, not the probes and admin calls"


async def test_admin_config_and_advisory_metric(fake_upstream, start_router, http):
    r = await start_router(
        upstream=fake_upstream.url,
        shutdown_drain_secs=10,
        termination_grace_secs=10,
        readiness_probe_period_secs=5,
        readiness_probe_failure_threshold=3,
        upstream_health_path="/health",
        upstream_health_interval_secs=3,  # 3 x 3 + 2 = 11 s to notice a dead model server > the 10 s drain
    )
    async with http.get(f"{r.admin}/admin/config") as resp:
        data = await resp.json()
    assert data["config"]["drain"]["termination_grace_secs"] == 10
    assert sorted(a["code"] for a in data["advisories"]) == [
        "DRAIN_CONSUMES_GRACE",
        "DRAIN_SHORTER_THAN_PROBE_WINDOW",
        "UPSTREAM_HEALTH_SLOWER_THAN_DRAIN",
    ]
    [slow] = [a for a in data["advisories"] if a["code"] == "UPSTREAM_HEALTH_SLOWER_THAN_DRAIN"]
    assert (slow["upstream_health_notice_secs"], slow["shutdown_drain_secs"]) == (11, 10)
    async with http.get(f"{r.admin}/metrics") as resp:
        text = await resp.text()
    assert 'drain_router_advisory{code="DRAIN_CONSUMES_GRACE"} 1.0' in text
    assert 'drain_router_advisory{code="DRAIN_SHORTER_THAN_PROBE_WINDOW"} 1.0' in text
    assert 'drain_router_advisory{code="UPSTREAM_HEALTH_SLOWER_THAN_DRAIN"} 1.0' in text
    assert "drain_router_termination_grace_seconds 10.0" in text


async def test_requests_total_by_code_and_outcome(fake_upstream, start_router, http):
    r = await start_router(upstream=fake_upstream.url, max_request_body_bytes=10)
    async with http.get(f"{r.url}/status/404") as resp:
        await resp.read()
    async with http.post(f"{r.url}/echo", data=b"x" * 11) as resp:
        await resp.read()
    async with http.get(f"{r.admin}/metrics") as resp:
        text = await resp.text()
    assert 'drain_router_requests_total{code="404",outcome="completed"} 1.0' in text
    assert 'drain_router_requests_total{code="413",outcome="rejected"} 1.0' in text


async def test_startup_advisory_logged_once(fake_upstream, start_router):
    from structlog.testing import capture_logs

    with capture_logs() as logs:
        r = await start_router(upstream=fake_upstream.url, shutdown_drain_secs=30)
        r.sigterm()
        r.sigterm()
        await r.exit_code()
    advisories = [e for e in logs if e["event"] == "startup.advisory"]
    assert len(advisories) == 1
    assert advisories[0]["code"] == "DRAIN_CONSUMES_GRACE" and advisories[0]["grace_declared"] is False
    assert advisories[0]["log_level"] == "warning"


async def test_upstream_up_follows_the_last_connect_without_a_health_path(start_router, http):
    """Without --upstream-health-path, drain_router_upstream_up is 1 once a request reached the model
    server and 0 once one could not connect."""
    async with fake_model_testing.running() as fake:
        r = await start_router(upstream=fake.url)
        async with http.get(f"{r.url}/sse?n=1&iv=0") as resp:
            await resp.read()
        assert r.router.metrics.registry.get_sample_value("drain_router_upstream_up") == 1
    async with http.get(f"{r.url}/sse?n=1&iv=0") as resp:  # the model server is gone now
        assert resp.status == 502
    assert r.router.metrics.registry.get_sample_value("drain_router_upstream_up") == 0
    assert r.state.readiness()[0] == 200, "readiness does not depend on it without a health path"
