"""The targets of the conformance suite, one of each per test module (module-scoped, in the module's
event loop): a router process in front of the gRPC test upstream, a router process in front of the
reference server, the gRPC listener built in this process, and the reference server."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from prometheus_client import CollectorRegistry

from drain_router import config, metrics
from drain_router.grpc.listener import GrpcListener
from drain_router.state import RouterState
from tests import grpcupstream, nghttpd
from tests.h2conformance.cases import Case, Target
from tests.process import router_starter

#: The reference server's response to ``GET /``, and the large file the flow-control cases read.
INDEX_HTML = b"<!DOCTYPE html>\n<title>h2spec</title>\n<p>The reference server's index.</p>\n"
LARGE_FILE_BYTES = 100_000


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A case the reference server is known to fail is a strict xfail for that target alone."""
    for item in items:
        params = getattr(item, "callspec", None)
        if params is None or params.params.get("target") != "nghttpd":
            continue
        case = params.params.get("case")
        if isinstance(case, Case) and case.reference_xfail is not None:
            item.add_marker(pytest.mark.xfail(reason=case.reference_xfail, strict=True))


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def conformance_upstream() -> AsyncIterator[grpcupstream.Upstream]:
    """The gRPC test upstream (tests/grpcupstream.py), shared by the module's router targets."""
    async with grpcupstream.running() as up:
        yield up


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def reference_server(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[int | None]:
    """The reference server's port (None: ``nghttpd`` is not on PATH), shared by the module's
    ``nghttpd`` target and the router in front of it; it serves :func:`reference_docroot`."""
    if not nghttpd.available():
        yield None
        return
    async with nghttpd.serving(reference_docroot(tmp_path_factory.mktemp("nghttpd-docroot"))) as port:
        yield port


def reference_docroot(docroot: Path) -> Path:
    """The reference server's files: ``GET /`` answers :data:`INDEX_HTML`, and the flow-control
    cases read ``/large.bin``; every answer carries a ``content-length``."""
    (docroot / "index.html").write_bytes(INDEX_HTML)
    (docroot / "large.bin").write_bytes(b"x" * LARGE_FILE_BYTES)
    return docroot


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def target(
    request: pytest.FixtureRequest,
    conformance_upstream: grpcupstream.Upstream,
    reference_server: int | None,
) -> AsyncIterator[Target]:
    """The server under test, by name (the test's ``target`` parameter)."""
    name = request.param
    upstream_url = f"http://127.0.0.1:{conformance_upstream.port}"
    if name in ("nghttpd", "router-nghttpd") and reference_server is None:
        pytest.skip(f"nghttpd is not on PATH (Debian package nghttp2-server): the {name} target is skipped")
    if name in ("router", "router-nghttpd"):
        # What the ``grpc_router`` fixture starts (tests/grpc/conftest.py), once for the module: in
        # front of the gRPC test upstream, or of the reference server (a real HTTP/2 upstream, whose
        # answers carry a content-length: HEAD's too, with no content).
        grpc = name == "router"
        upstream = upstream_url if grpc else f"http://127.0.0.1:{reference_server}"
        async with router_starter("http://127.0.0.1:9") as start:
            router = await start("--grpc-port", "0", "--grpc-upstream", upstream)
            assert router.grpc_port is not None
            yield Target(name, router.grpc_port, grpc=grpc, large_path="/large.bin")
    elif name == "listener":
        async with in_process_listener(upstream_url) as port:
            yield Target("listener", port, grpc=True)
    elif name == "nghttpd":
        assert reference_server is not None
        yield Target("nghttpd", reference_server, grpc=False, large_path="/large.bin", exact_codes=False)
    else:
        raise AssertionError(f"unknown target {name}")


@contextlib.asynccontextmanager
async def in_process_listener(upstream_url: str) -> AsyncIterator[int]:
    """A :class:`GrpcListener` in this event loop, built as the router's lifecycle builds it: the
    minimum of a RouterState (a config with the gRPC upstream), warmed (the model server's stream
    limit learnt), then bound."""
    cfg = config.build_config(
        upstream="http://127.0.0.1:9", host="127.0.0.1", port=0, admin_port=0, grpc_port=0, grpc_upstream=upstream_url
    )
    assert cfg.grpc.upstream is not None
    state = RouterState(cfg, metrics.Metrics(CollectorRegistry()))
    listener = GrpcListener(
        state, cfg.grpc.upstream, float(cfg.proxy.upstream_connect_timeout_secs), connection_limit=256
    )
    try:
        await listener.warm(asyncio.Event())
        yield await listener.bind("127.0.0.1", 0)
    finally:
        listener.close()
