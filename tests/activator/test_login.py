"""How ``drain-router activator`` finds the API server without ``--kube-api``: the controller's rule
(``drain_router.kubelogin``), a real process with its environment. No service account here: the
kubeconfig of ``KUBECONFIG`` (each path of the list), else ``~/.kube/config``; with neither, one line
and the controller's exit status."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

from drain_router import kubelogin
from drain_router.controller import operator
from drain_router_dev import fake_kube
from drain_router_dev import process as process_
from tests.process import RouterProcess, log_path

from .stand_ins import assign, wait_listening

TOKEN = "kubeconfig-t0ken"


def argv() -> list[str]:
    """The stand-ins' activator, without ``--kube-api``."""
    return [
        *(sys.executable, "-m", "drain_router", "activator", "--host", "127.0.0.1", "--admin-host", "127.0.0.1"),
        *("--admin-port", "0", "--ports-configmap", fake_kube.PORTS_CONFIGMAP, "--poll-interval-secs", "0.1"),
        *("--shutdown-drain-secs", "0"),
    ]


def environment(home: Path, **extra: str) -> dict[str, str]:
    """This environment with no way to a cluster (no service account host, no KUBECONFIG, an empty
    home), and ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBERNETES_", "KUBECONFIG"))}
    return {**env, "HOME": str(home), **extra}


def kubeconfig(path: Path, server: str) -> Path:
    user = {"token": TOKEN}
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "stand-in", "cluster": {"server": server}}],
                "users": [{"name": "activator", "user": user}],
                "contexts": [{"name": "stand-in", "context": {"cluster": "stand-in", "user": "activator"}}],
                "current-context": "stand-in",
            }
        )
    )
    return path


async def test_out_of_cluster_it_reads_the_port_map_through_kubeconfig(
    kube: fake_kube.FakeKube, tmp_path: Path
) -> None:
    """1. a port map with one port 2. ``KUBECONFIG=<missing>:<kubeconfig>`` naming the stand-in
    API with a token, no service account, no ``--kube-api``. Result: the activator reads the port
    map from the stand-in, every call with ``Authorization: Bearer <the kubeconfig's token>``, and
    listens on the map's port."""
    assign(kube, f"{fake_kube.NS}/{fake_kube.NAME}/http")
    path = kubeconfig(tmp_path / "config", kube.url)
    listed = os.pathsep.join([str(tmp_path / "missing"), str(path)])
    proc = process_.Process("activator", argv(), log_path("activator"), env=environment(tmp_path, KUBECONFIG=listed))
    proc.start()
    act = RouterProcess(proc)
    try:
        await act.wait_event("startup.listening", timeout=30)
        assert act.admin_port is not None
        await wait_listening(act.admin_port, kube.ports)
    finally:
        await act.kill()
    assert kube.calls_to("GET", fake_kube.PORTS_NAME) >= 1
    assert set(kube.authorizations) == {f"Bearer {TOKEN}"}, kube.authorizations


def test_with_no_cluster_and_no_kubeconfig_one_line_and_the_controllers_status(tmp_path: Path) -> None:
    """1. no service account, no KUBECONFIG, an empty home, no ``--kube-api``. Result: exit status 2,
    the controller's (``EXIT_NO_CLUSTER``), and one JSON line ``activator.no_cluster`` naming where it
    looked (``~/.kube/config``) and the remedy; no traceback."""
    result = subprocess.run(argv(), env=environment(tmp_path), capture_output=True, text=True, timeout=60, check=False)
    output = (result.stdout + result.stderr).splitlines()
    assert result.returncode == operator.EXIT_NO_CLUSTER == kubelogin.EXIT_NO_CLUSTER == 2, output
    assert len(output) == 1, output
    event = json.loads(output[0])
    assert event["event"] == "activator.no_cluster" and event["level"] == "error"
    assert "not in a cluster" in event["error"] and str(tmp_path / ".kube" / "config") in event["error"]
    assert "KUBECONFIG" in event["remedy"]


def test_an_unusable_kubeconfig_is_one_line_too(tmp_path: Path) -> None:
    """``KUBECONFIG`` naming a file that is no kubeconfig (no current context): exit 2, one line
    saying the kubeconfig is unusable."""
    broken = tmp_path / "broken"
    broken.write_text("apiVersion: v1\nkind: Config\n")
    env = environment(tmp_path, KUBECONFIG=str(broken))
    result = subprocess.run(argv(), env=env, capture_output=True, text=True, timeout=60, check=False)
    output = (result.stdout + result.stderr).splitlines()
    assert result.returncode == 2 and len(output) == 1, output
    event = json.loads(output[0])
    assert event["event"] == "activator.no_cluster" and "kubeconfig is unusable" in event["error"], event
