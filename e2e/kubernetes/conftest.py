"""The session's cluster: a real control plane (built once, cached), the Gateway API CRDs, and the
controller chart with its activator installed by the real helm, watching every namespace.

One cluster per machine at a time (kube-proxy's rules and the node's bridge are the machine's): a
second run waits for the first. The scenarios' timeouts are their own calls' (``func_only``): the
wait for another run's cluster is not a scenario's. Needs root, ``ip`` and ``iptables``, and Go to build the binaries
the first time; without them the scenarios skip, or fail with ``CI`` set.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import psutil
import pytest

from drain_router_dev.kube import control_plane
from drain_router_dev.kube.api import Api
from drain_router_dev.process import wait_until
from e2e.kubernetes.audit import service_account
from e2e.kubernetes.kube import CONTROLLER_CHART, GATEWAY_CRDS, Helm, Kube, load_yaml_dir
from tests.chart.helm import obtain_helm

CONTROLLER_NAMESPACE = "drain-router-system"
CONTROLLER_RELEASE = "ctl"
#: The user the controller's requests authenticate as (its ServiceAccount's token).
CONTROLLER_USER = service_account(CONTROLLER_NAMESPACE, f"{CONTROLLER_RELEASE}-drain-router-controller")
#: The namespaces the scenarios put model services in.
MODEL_NAMESPACES = ("team-a", "team-b")
#: Everything a cold build and the cluster may take before the first scenario: the lock's wait too.
SESSION_TIMEOUT_SECS = 3600


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``after_all`` last (a stable sort, after e2e/conftest.py's): they read what every
    other scenario of the session did."""
    items.sort(key=lambda item: item.get_closest_marker("after_all") is not None)


def missing() -> str | None:
    if os.geteuid() != 0:
        return "the node agent needs root (network namespaces, bind mounts)"
    for tool in ("go", "ip", "iptables", "openssl"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    return None


def controller_values() -> dict[str, object]:
    """The controller chart as the scenarios install it. InferencePool teardown is off: no scenario
    has one, and the RBAC audit (``test_rbac_audit.py``)
    refuses a grant that no scenario uses; it is proven against the API emulator (tests/controller/).
    GRPCRoute teardown is on: the gRPC wake through a GRPCRoute is uninstalled with its route."""
    return {
        "image": {"repository": "drain-router"},
        "watch": {"allNamespaces": True},
        "features": {"grpcRoutes": True, "inferencePools": False},
        "activator": {"enabled": True},
    }


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[control_plane.Cluster]:
    problem = missing()
    if problem is not None:
        if os.environ.get("CI"):
            pytest.fail(f"the real control plane cannot run: {problem}")
        pytest.skip(f"the real control plane cannot run here: {problem}")
    with control_plane.machine_lock(SESSION_TIMEOUT_SECS):
        root = tmp_path_factory.mktemp("cluster")
        running = control_plane.up(root)
        try:
            yield running
        finally:
            control_plane.down(root)


@pytest.fixture(scope="session")
def helm(cluster: control_plane.Cluster, tmp_path_factory: pytest.TempPathFactory) -> Helm:
    return Helm(obtain_helm(), tmp_path_factory.mktemp("helm-home"), cluster.kubeconfig)


@pytest.fixture(scope="session")
def installed(cluster: control_plane.Cluster, helm: Helm) -> control_plane.Cluster:
    """The CRDs and the controller chart, ready."""

    async def crds() -> None:
        api = Api(cluster.kubeconfig)
        kube = Kube(cluster, api)
        try:
            for crd in load_yaml_dir(GATEWAY_CRDS):
                await kube.apply(crd)
            for name in MODEL_NAMESPACES:
                await kube.create_namespace(name)
        finally:
            await api.close()

    asyncio.run(crds())
    helm.install(CONTROLLER_RELEASE, CONTROLLER_CHART, CONTROLLER_NAMESPACE, controller_values())
    return cluster


@pytest.fixture
async def kube(installed: control_plane.Cluster) -> AsyncIterator[Kube]:
    api = Api(installed.kubeconfig, keep_alive=False)
    try:
        yield Kube(installed, api)
    finally:
        await api.close()
        await _connections_closed(installed)


async def _connections_closed(cluster: control_plane.Cluster) -> None:
    """Until this process holds no connection to the API server: a TLS connection's close finishes
    in the event loop (its shutdown handshake), so one closed just before the loop ends would be
    reported as leaked by the next test."""
    port = int(cluster.server.rsplit(":", 1)[1])
    me = psutil.Process()
    await wait_until(
        lambda: not any(c.raddr and c.raddr.port == port for c in me.net_connections("tcp")),
        10,
        "this process's connections to the API server to close after its client closed",
    )


@pytest.fixture
def cluster_logs(installed: control_plane.Cluster) -> Path:
    return installed.root
