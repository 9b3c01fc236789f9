"""A rollout restart rolled by the real Deployment controller, under OpenAI SDK streaming clients,
through a gateway fed from the real EndpointSlices.

What ``kubectl rollout restart`` writes (a ``restartedAt`` annotation on the pod template) starts
it; the Deployment and ReplicaSet controllers replace the pods one by one (maxUnavailable 0), the
scheduler binds them, the node agent runs them and ends the old ones as the kubelet does (preStop,
SIGTERM, grace), the EndpointSlice controller marks each old pod not ready from the router's
``/readyz``, and the gateway follows the EndpointSlices ``delay`` seconds late. With the drain on,
no stream is lost at any delay; with it off (the control), some are: the clients can see a loss.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from e2e import real_engine
from e2e.kubernetes import models
from e2e.kubernetes.gateway import Gateway
from e2e.kubernetes.kube import MODEL_CHART, Helm, Kube, restart, rolled_out
from e2e.real_engine import Outcome, SdkLoad

NAMESPACE = "team-a"
CLIENTS = 6
MAX_TOKENS = models.CHUNKS
pytestmark = pytest.mark.timeout(600, func_only=True)


def without_drain(values: dict[str, Any]) -> dict[str, Any]:
    """The control: no drain window (``--shutdown-drain-secs 0``), everything else the same."""
    values["shutdownDrainSecs"] = 0
    values["router"]["readinessProbe"]["declareToRouter"] = False
    return values


async def run_rollout(
    kube: Kube, helm: Helm, tmp_path: Path, haproxy_bin: str, values: dict[str, Any], *, release: str,
    delay: float, clients: int = CLIENTS, max_tokens: int = MAX_TOKENS,
) -> SdkLoad:  # fmt: skip
    helm.install(release, MODEL_CHART, NAMESPACE, values)
    host = models.hostname(NAMESPACE, release)
    gateway = Gateway(kube.api, haproxy_bin, tmp_path, delay_secs=delay)
    await gateway.start()
    deployment = f"{release}-drain-router"
    try:
        await kube.wait("the gateway serving both pods", lambda: _async(len(gateway.servers(host)) == 2))
        load = SdkLoad(gateway.url, clients, max_tokens, headers={"Host": host})
        await load.start()
        await kube.wait(
            "streams completed before the rollout", lambda: _async(load.count(Outcome.COMPLETED) >= clients)
        )
        generation = await restart(kube, NAMESPACE, deployment)
        await rolled_out(kube, NAMESPACE, deployment, generation, replicas=2)
        # The new pods in the gateway too, and streams completed on them.
        await kube.wait("the gateway serving the new pods", lambda: _pods_served(kube, gateway, host, deployment))
        before = load.count(Outcome.COMPLETED)
        await kube.wait(
            "streams completed after the rollout", lambda: _async(load.count(Outcome.COMPLETED) >= before + clients)
        )
        await load.stop()
        return load
    finally:
        await gateway.stop()
        helm.uninstall(release, NAMESPACE)


async def _async(value: bool) -> bool:
    return value


async def _pods_served(kube: Kube, gateway: Gateway, host: str, deployment: str) -> bool:
    pods = await kube.ready_pods(NAMESPACE, f"app.kubernetes.io/instance={deployment.removesuffix('-drain-router')}")
    addresses = {p["status"]["podIP"] for p in pods}
    return len(addresses) == 2 and {a for a, _ in gateway.servers(host)} == addresses


@pytest.mark.parametrize("delay", [0.0, 2.0], ids=["gateway-0s", "gateway-2s"])
async def test_rollout_restart_loses_no_stream(
    kube: Kube, helm: Helm, tmp_path: Path, haproxy_bin: str, delay: float, report: list[str]
) -> None:
    release = f"roll{int(delay)}"
    values = models.fake_model_values(NAMESPACE, release)
    load = await run_rollout(kube, helm, tmp_path, haproxy_bin, values, release=release, delay=delay)
    lost = [r for r in load.records if r.outcome is not Outcome.COMPLETED]
    report.append(f"drain on, gateway {delay:.0f} s late: {len(load.records)} streams, {len(lost)} lost")
    assert load.count(Outcome.COMPLETED) >= 3 * CLIENTS
    assert not lost, lost[:5]


async def test_rollout_restart_without_the_drain_loses_streams(
    kube: Kube, helm: Helm, tmp_path: Path, haproxy_bin: str, report: list[str]
) -> None:
    values = without_drain(models.fake_model_values(NAMESPACE, "rolloff"))
    load = await run_rollout(kube, helm, tmp_path, haproxy_bin, values, release="rolloff", delay=1.0)
    lost = [r for r in load.records if r.outcome is not Outcome.COMPLETED]
    report.append(f"drain off (control), gateway 1 s late: {len(load.records)} streams, {len(lost)} lost")
    assert lost, "the control lost nothing: the scenario cannot see a loss"


@pytest.fixture
def gguf(engine_installed: None) -> str:
    return str(real_engine.gguf_path())


@pytest.mark.engine
@pytest.mark.parametrize("drain", [True, False], ids=["drain-on", "drain-off-control"])
async def test_rollout_restart_of_the_real_engine(
    kube: Kube, helm: Helm, tmp_path: Path, haproxy_bin: str, gguf: str, drain: bool, report: list[str]
) -> None:
    """The same rollout with llama.cpp's server as the model server: two single-threaded engines,
    four clients (two generating, two queued in the engines), the gateway 1 s late (the control 2 s)."""
    release = "rollllm" if drain else "rollllmoff"
    values = models.engine_values(NAMESPACE, release, gguf)
    if not drain:
        values = without_drain(values)
    # The control's gateway is 2 s late: a wide enough window that a loss is seen on a busy machine too.
    delay = 1.0 if drain else 2.0
    load = await run_rollout(
        kube, helm, tmp_path, haproxy_bin, values, release=release, delay=delay, clients=4, max_tokens=48
    )
    lost = [r for r in load.records if r.outcome is not Outcome.COMPLETED]
    report.append(f"real engine, drain {'on' if drain else 'off'}: {len(load.records)} streams, {len(lost)} lost")
    if drain:
        assert not lost, lost[:5]
    else:
        assert lost, "the control lost nothing: the scenario cannot see a loss"
