"""What the controller chart's modes rely on, with the real operator against the API emulator: an
InferencePool torn down route first (as the route itself, or right after the HTTPRoute), a
namespaced install without access to nodes (--no-node-reads), and kopf's liveness endpoint."""

from __future__ import annotations

import socket
from typing import Any

import aiohttp
import kmock
import pytest

from drain_router_dev import process as process_
from tests.chart import helm as chart

from .conftest import ClusterEmulator, Operator, eventually
from .emulator import Rule, rules_of
from .scenario import delete_msvc, delete_order, exists, final_status, make_service, msvc, stage

POOLS = "inference.networking.k8s.io/v1/inferencepools"
POOL_REF = {"apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool", "name": "llama-pool"}


def controller_chart_rules(helm: chart.Helm, values: dict[str, Any]) -> list[Rule]:
    docs = helm.template(values, chart=chart.CONTROLLER_CHART)
    return rules_of(chart.find(docs, "Role") + chart.find(docs, "ClusterRole"))


async def test_inference_pool_as_the_route_goes_first_then_settles(
    cluster: tuple[ClusterEmulator, kmock.Server], operator: Operator
) -> None:
    """1. ModelService whose route is an InferencePool (a shared HTTPRoute elsewhere points at it).
    2. Deleted. Result: the pool is deleted first; during RouteSettling the Deployment still exists;
    then the workload, then Released, Clean."""
    emu, server = cluster
    await make_service(emu, route=POOL_REF, pool="llama-pool", route_object=False)
    await delete_msvc(emu, server)
    await eventually(lambda: stage(emu) == "RouteSettling", what="RouteSettling")
    assert not exists(emu, POOLS, "llama-pool")
    assert exists(emu, "apps/v1/deployments") and exists(emu, "v1/services")
    await eventually(lambda: msvc(emu) is None, what="the ModelService to be released")
    order = delete_order(emu)
    assert order[0] == "inferencepools/llama-pool"
    assert order.index("inferencepools/llama-pool") < order.index("deployments/llama") < order.index("services/llama")
    assert final_status(emu)["outcome"] == "Clean"


async def test_http_route_first_then_the_pool_then_the_workload(
    cluster: tuple[ClusterEmulator, kmock.Server], operator: Operator
) -> None:
    """1. HTTPRoute -> InferencePool -> pods, as the chart renders it (the pool first in spec.workload).
    2. Deleted. Result: route, settle, then the pool before the Deployment and Service."""
    emu, server = cluster
    await make_service(emu, pool="llama-pool")
    await delete_msvc(emu, server)
    await eventually(lambda: stage(emu) == "RouteSettling", what="RouteSettling")
    assert exists(emu, POOLS, "llama-pool"), "the pool is workload: it waits for the settle"
    await eventually(lambda: msvc(emu) is None, what="the ModelService to be released")
    order = delete_order(emu)
    assert order[:2] == ["httproutes/llama", "inferencepools/llama-pool"]
    assert order.index("inferencepools/llama-pool") < order.index("deployments/llama")


async def test_a_pool_listed_only_in_the_workload_is_still_removed_first(
    cluster: tuple[ClusterEmulator, kmock.Server], operator: Operator
) -> None:
    """1. No spec.route; the InferencePool is listed last in spec.workload. 2. Deleted. Result: the
    pool is the route (removed first, then the settle), not just one more workload object."""
    emu, server = cluster
    await make_service(emu, route=None, pool="llama-pool", pool_last=True, route_object=False)
    assert msvc(emu)["spec"]["workload"][-1] == POOL_REF
    await delete_msvc(emu, server)
    await eventually(lambda: stage(emu) == "RouteSettling", what="RouteSettling")
    assert not exists(emu, POOLS, "llama-pool") and exists(emu, "apps/v1/deployments")
    await eventually(lambda: msvc(emu) is None, what="the ModelService to be released")
    assert delete_order(emu)[0] == "inferencepools/llama-pool"
    assert final_status(emu)["outcome"] == "Clean"


async def test_without_the_inference_pools_feature_the_refused_call_is_named(
    cluster: tuple[ClusterEmulator, kmock.Server], start_operator: Any, helm: chart.Helm
) -> None:
    """The chart grants inferencepools only with features.inferencePools: without it the teardown
    does not skip the pool, it waits and times out naming the refused call."""
    emu, server = cluster
    emu.rbac = controller_chart_rules(helm, {"features": {"inferencePools": False}})
    await make_service(emu, route=POOL_REF, pool="llama-pool", route_object=False, deletion_spec={"maxWait": "2s"})
    await start_operator(read_nodes=False)
    await delete_msvc(emu, server)
    await eventually(lambda: msvc(emu) is None, what="the teardown to time out", timeout=20)
    status = final_status(emu)
    assert status["outcome"] == "TimedOut"
    assert "inferencepools/llama-pool" in status["message"] and "403" in status["message"], status["message"]
    assert exists(emu, POOLS, "llama-pool") and exists(emu, "apps/v1/deployments")


@pytest.mark.parametrize("read_nodes", [False, True])
async def test_namespaced_install_needs_no_node_reads(
    cluster: tuple[ClusterEmulator, kmock.Server], start_operator: Any, helm: chart.Helm, read_nodes: bool
) -> None:
    """The namespaced chart grants nothing cluster-scoped. With --no-node-reads (what it passes) the
    teardown never asks for a node and ends Clean; reading nodes anyway is refused (403) and the pod
    stage waits on the failed read until the deadline."""
    emu, server = cluster
    rules = controller_chart_rules(helm, {})
    assert not [r for r in rules if "nodes" in r[1]], "the namespaced chart grants no nodes"
    emu.rbac = rules
    # Reading nodes: the pods outlive the deadline (they exit at their 30 s grace), so the pod stage
    # needs the refused read to the end; without: they exit at once and the teardown ends Clean.
    await make_service(
        emu, deletion_spec={"routeSettle": "0s", "maxWait": "4s"}, exits_after=None if read_nodes else 0.5
    )
    await start_operator(read_nodes=read_nodes)
    await delete_msvc(emu, server)
    await eventually(lambda: msvc(emu) is None, what="the ModelService to be released", timeout=20)
    outcome = final_status(emu)["outcome"]
    node_gets = [r for r in emu._requests if r.resource is not None and r.resource.plural == "nodes"]
    if read_nodes:
        assert outcome == "TimedOut" and "nodes/gpu-1" in final_status(emu)["message"]
    else:
        assert outcome == "Clean"
        assert node_gets == [], "a namespaced controller must not ask for nodes"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_liveness_endpoint_answers_while_the_operator_runs(start_operator: Any) -> None:
    port = _free_port()
    op = await start_operator(liveness_port=port)
    async with aiohttp.ClientSession() as session:

        async def alive() -> bool:
            try:
                async with session.get(f"http://127.0.0.1:{port}/healthz") as response:
                    return response.status == 200
            except aiohttp.ClientError:
                return False

        # kopf starts the endpoint with the operator, not before ready_flag
        await process_.wait_until(alive, 10, "kopf's /healthz to answer 200")
        await op.stop()
        assert not await alive(), "a stopped operator must fail the liveness probe"


def test_the_flags_the_controller_chart_passes_reach_the_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """The chart's args (--no-node-reads, --liveness-port) become settings; the defaults keep node
    reads on and /healthz on the chart's port, 8081."""
    from click.testing import CliRunner

    from drain_router import cli
    from drain_router.controller import operator, settings

    received: list[settings.ControllerSettings] = []
    monkeypatch.setattr(operator, "run", lambda cfg: received.append(cfg) or 0)
    args = ["controller", "--namespace", "ns", "--no-node-reads", "--liveness-port", "8082", "--metrics-port", "9092"]
    assert CliRunner().invoke(cli.main, args).exit_code == 0
    assert CliRunner().invoke(cli.main, ["controller", "--all-namespaces", "--no-leader-election"]).exit_code == 0
    chosen, default = received
    assert chosen.read_nodes is False and chosen.liveness_port == 8082
    assert default.read_nodes is True and default.liveness_port == 8081
    same = CliRunner().invoke(cli.main, ["controller", "--namespace", "ns", "--liveness-port", "9092"])
    assert same.exit_code != 0 and "liveness_port and metrics_port" in same.output
