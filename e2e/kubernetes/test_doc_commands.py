"""The docs' cluster commands (``How.CLUSTER`` and ``How.HELM`` rows of tests/docs/commands.py), run as
written against the real control plane: the helm and kubectl binaries, the session's admin
kubeconfig, a directory laid out as a reader's (``charts/``, the values file, the packaged charts).

The session already runs a controller watching every namespace (release ``ctl``). A second one
installed by the docs' controller commands would act on the same ModelServices, so those run with
``--dry-run=server`` appended (rendered, the release name checked free, every object checked against
the API server's own schemas, nothing created); the model release is installed for real, without
waiting for its pods (the engine image is a GPU model server), and uninstalled.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from drain_router_dev.kube import control_plane
from drain_router_dev.process import wait_until
from e2e.kubernetes.kube import Helm, Kube
from tests.docs.commands import How, all_commands, rows_for
from tests.docs.reader import reader_dir

DOCS_NAMESPACE = "models"
#: Three model releases installed and torn down (each through the controller: route, settle, workload).
pytestmark = pytest.mark.timeout(900, func_only=True)


def _commands(how: How, word: str) -> list[str]:
    return [c.text for c in all_commands() if [r.how for r in rows_for(c)] == [how] and word in c.text]


def _run(text: str, cwd: Path, helm: Helm, **extra: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "KUBECONFIG": str(helm.kubeconfig),
        "HELM_CACHE_HOME": str(helm.home / "cache"),
        "HELM_CONFIG_HOME": str(helm.home / "config"),
        "HELM_DATA_HOME": str(helm.home / "data"),
        "PATH": f"{helm.binary.parent}{os.pathsep}{os.environ['PATH']}",
        **extra,
    }
    return subprocess.run(["bash", "-c", text], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture
def reader(helm: Helm, tmp_path: Path) -> Path:
    return reader_dir(tmp_path, helm.binary)


def test_the_controller_installs_validate_on_the_api_server(
    installed: control_plane.Cluster, helm: Helm, reader: Path
) -> None:
    controller_commands = [t for t in _commands(How.HELM, "helm ") if "drain-router-controller" in t.split()[3]]
    assert len(controller_commands) >= 3
    for text in controller_commands:
        done = _run(f"{text} --dry-run=server", reader, helm)
        assert done.returncode == 0, f"{text}\n{done.stderr[-3000:]}"


async def test_the_model_installs_as_written_and_the_labels_apply(
    installed: control_plane.Cluster, helm: Helm, kube: Kube, reader: Path
) -> None:
    """The README's model release (kubernetes.md and install.md give the same, the latter from the
    archive): installed as written, its objects created by the API server; then the controller doc's
    kubectl labels on an HTTPRoute and a Deployment named llama in namespace llama (the chart's, by
    another release name and namespace); uninstalled after."""
    model = [t for t in _commands(How.HELM, "helm install llama")]
    assert len(model) == 3
    for text in model:
        done = _run(text, reader, helm)
        assert done.returncode == 0, f"{text}\n{done.stderr[-3000:]}"
        assert await kube.get("ModelService", DOCS_NAMESPACE, "llama-drain-router")
        helm.uninstall("llama", DOCS_NAMESPACE)
    # The objects the kubectl labels name: the chart's, as a release "llama" in namespace "llama"
    # with fullnameOverride "llama" (a route and a Deployment written by another chart, by name).
    done = _run(
        "helm install llama charts/drain-router -n llama --create-namespace -f llama.yaml "
        "--set fullnameOverride=llama --set modelService.enabled=false",
        reader,
        helm,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    try:
        for text in _commands(How.CLUSTER, "kubectl"):
            done = _run(text, reader, helm)
            assert done.returncode == 0, f"{text}\n{done.stderr[-3000:]}"
        route = await kube.get("HTTPRoute", "llama", "llama")
        deployment = await kube.get("Deployment", "llama", "llama")
        for obj in (route, deployment):
            assert obj["metadata"]["labels"]["drainrouter.dev/service"] == "llama"
    finally:
        helm.uninstall("llama", "llama")


async def test_the_controller_runs_as_written(
    installed: control_plane.Cluster, helm: Helm, kube: Kube, tmp_path: Path
) -> None:
    """`drain-router controller --namespace models` out of the cluster, with the admin kubeconfig:
    kopf logs in and starts watching; SIGTERM: exit 0. Its ports moved to free ones (0) by its
    environment. Run while `models` holds no ModelService, so it acts on nothing the session's own
    controller serves."""
    [text] = _commands(How.CLUSTER, "drain-router controller")
    await kube.create_namespace(DOCS_NAMESPACE)  # the reader's: its Lease is kept there
    log_path = tmp_path / "controller.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            ["bash", "-c", text.split("#")[0]],
            env={
                **os.environ,
                # As a reader who installed the package: its commands on PATH (the tests' own venv).
                "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
                "KUBECONFIG": str(helm.kubeconfig),
                "DRAIN_ROUTER_CONTROLLER_METRICS_PORT": "0",
                "DRAIN_ROUTER_CONTROLLER_LIVENESS_PORT": "0",
            },
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        await wait_until(
            lambda: "kopf." in log_path.read_text() or proc.poll() is not None, 60, "kopf's first log line"
        )
        assert proc.poll() is None, log_path.read_text()[-3000:]
        os.killpg(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, log_path.read_text()[-3000:]
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
