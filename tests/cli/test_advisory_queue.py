"""The QUEUE_TIMEOUT_EXCEEDS_DRAIN advisory as a table (tests/cases/advisory/queue-timeout.yaml), and
its plumbing: the config feeds it, /admin/config and ``check`` list it, ``check --strict`` exits 1."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import pytest
import structlog
from click.testing import CliRunner

from drain_router import cli, config
from drain_router.decisions import advisory
from tests import casefiles

CASES = casefiles.load("advisory/queue-timeout.yaml")
CODE = "QUEUE_TIMEOUT_EXCEEDS_DRAIN"


@pytest.mark.parametrize("case", casefiles.params(CASES))
def test_queue_timeout_exceeds_drain(case: dict[str, Any]) -> None:
    found = advisory.queue_timeout_exceeds_drain(case["drain"], case["limit"], case["size"], case["timeout"])
    if not case["warns"]:
        assert found is None
        return
    assert found is not None
    assert found.code is advisory.Code.QUEUE_TIMEOUT_EXCEEDS_DRAIN
    assert found.as_dict() == {
        "code": CODE,
        "message": advisory.MESSAGES[advisory.Code.QUEUE_TIMEOUT_EXCEEDS_DRAIN],
        "queue_timeout_secs": case["timeout"],
        "shutdown_drain_secs": case["drain"],
    }
    assert str(case["timeout"]) not in found.message, "a static message; the numbers are fields"


def _cfg(**raw: object) -> config.Config:
    return config.build_config(upstream="http://127.0.0.1:8000", termination_grace_secs=120, **raw)


def test_the_config_feeds_it_and_effective_lists_it() -> None:
    assert config.advisories(_cfg(queue_timeout_secs=600)) == (), "admission off: silent"
    cfg = _cfg(max_concurrent_requests=4, queue_timeout_secs=45)
    [found] = config.advisories(cfg)
    assert found.as_dict()["queue_timeout_secs"] == 45 and found.as_dict()["shutdown_drain_secs"] == 30
    assert [a["code"] for a in config.effective(cfg)["advisories"]] == [CODE]
    assert config.advisories(_cfg(max_concurrent_requests=4, queue_timeout_secs=30)) == ()


def test_it_comes_last_in_the_stable_order() -> None:
    cfg = config.build_config(upstream="http://127.0.0.1:8000", max_concurrent_requests=1, queue_timeout_secs=45)
    found = config.advisories(cfg)
    assert [a.code.value for a in found] == ["DRAIN_CONSUMES_GRACE", CODE]


async def test_a_router_logs_lists_and_exports_it(fake_upstream: Any, start_router: Any) -> None:
    with structlog.testing.capture_logs() as logs:
        r = await start_router(
            upstream=fake_upstream.url,
            shutdown_drain_secs=10,
            termination_grace_secs=60,
            max_concurrent_requests=2,
            queue_timeout_secs=11,
        )
    [logged] = [e for e in logs if e["event"] == "startup.advisory"]
    assert (logged["code"], logged["queue_timeout_secs"], logged["shutdown_drain_secs"]) == (CODE, 11, 10)
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{r.admin}/admin/config") as resp:
            data = await resp.json()
        async with http.get(f"{r.admin}/metrics") as resp:
            text = await resp.text()
    assert [a["code"] for a in data["advisories"]] == [CODE]
    assert data["config"]["admission"]["queue_timeout_secs"] == 11
    assert f'drain_router_advisory{{code="{CODE}"}} 1.0' in text


@pytest.mark.parametrize(
    ("flags", "exit_code"),
    [
        pytest.param(["--max-concurrent-requests", "4"], 0, id="the-default-timeout-is-the-drain"),
        pytest.param(["--max-concurrent-requests", "4", "--queue-timeout-secs", "60"], 1, id="a-minute-over-the-drain"),
        pytest.param(["--max-concurrent-requests", "4", "--queue-timeout-secs", "30.5"], 1, id="a-fraction-over"),
        pytest.param(["--max-concurrent-requests", "4", "--queue-timeout-secs", "30"], 0, id="timeout-within-drain"),
        pytest.param(["--max-concurrent-requests", "4", "--queue-size", "0"], 0, id="no-queue"),
        pytest.param(["--queue-timeout-secs", "600"], 0, id="admission-off"),
    ],
)
def test_check_strict_exits_1_with_it(flags: list[str], exit_code: int) -> None:
    args = ["check", "--strict", "--upstream", "http://127.0.0.1:8000", "--termination-grace-secs", "120", *flags]
    result = CliRunner().invoke(cli.main, args, env={}, catch_exceptions=False)
    assert result.exit_code == exit_code, result.output
    codes = [a["code"] for a in json.loads(result.output)["advisories"]]
    assert codes == ([CODE] if exit_code else [])
