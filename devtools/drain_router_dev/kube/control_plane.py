"""A real Kubernetes control plane as local processes: etcd, the API server, the controller manager,
the scheduler and kube-proxy of one release, plus the node agent that stands in for the kubelet.

Everything lives under one state directory (certificates, kubeconfigs, logs, pid files), except
etcd's data, which goes to tmpfs without fsync: a test cluster. The processes run in sessions of
their own and outlive the command that started them (``make cluster``); :func:`down` stops what the
pid files name and removes the node's network. One cluster per machine at a time: kube-proxy's rules
and the bridge live in the machine's own network namespace, so :func:`up` first stops the cluster
started before it (a run killed before its ``down`` left it running).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import ipaddress
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from drain_router_dev.kube.network import Bridge
from drain_router_dev.kube.node import remove_leftovers
from drain_router_dev.kube.pki import Identity, Pki
from drain_router_dev.process import free_port

REPO = Path(__file__).resolve().parents[3]
BUILD = REPO / "cluster" / "build.sh"
BRIDGE = Bridge("drk0", ipaddress.IPv4Network("10.244.0.0/24"))
SERVICE_CIDR = "10.96.0.0/16"
KUBERNETES_SERVICE_IP = "10.96.0.1"
NODE = "node-1"
LOCK = Path("/run/drain-router-cluster.lock")
#: The state directory of the cluster last started on this machine: a run killed before its
#: ``down`` leaves its processes behind, and the next ``up`` stops them first.
CURRENT = Path("/run/drain-router-cluster.current")

#: The controllers the scenarios need, and nothing that needs what this machine has not (volumes,
#: cloud, node IPAM): each a real controller of the controller manager.
CONTROLLERS = (
    "deployment-controller",
    "replicaset-controller",
    "endpointslice-controller",
    "endpoints-controller",
    "garbage-collector-controller",
    "namespace-controller",
    "disruption-controller",
    "serviceaccount-controller",
    "serviceaccount-token-controller",
    "root-ca-certificate-publisher-controller",
    "clusterrole-aggregation-controller",
    "pod-garbage-collector-controller",
    "node-lifecycle-controller",
)

#: Every request, its user and verb, no bodies: what the RBAC scenario reads back.
AUDIT_POLICY = {"apiVersion": "audit.k8s.io/v1", "kind": "Policy", "rules": [{"level": "Metadata"}]}

IDENTITIES = [
    Identity("admin", "kubernetes-admin", ("system:masters",)),
    Identity("controller-manager", "system:kube-controller-manager"),
    Identity("scheduler", "system:kube-scheduler"),
    Identity("proxy", "system:kube-proxy"),
    Identity("node", f"system:node:{NODE}", ("system:nodes",)),
]


class ClusterFailed(RuntimeError):
    """A component did not start; the message carries its log's tail."""


def binaries() -> Path:
    """The directory with ``kube`` and ``etcd``: built on the first call (minutes), cached after."""
    result = subprocess.run([str(BUILD)], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise ClusterFailed(f"building the control plane failed:\n{result.stderr[-4000:]}")
    return Path(result.stdout.strip().splitlines()[-1])


@dataclasses.dataclass(frozen=True)
class Cluster:
    """A running (or stopped) cluster's state directory and the API server's address."""

    root: Path

    @property
    def pki(self) -> Pki:
        return Pki(self.root / "pki")

    @property
    def kubeconfig(self) -> Path:
        return self.root / "kubeconfig"

    @property
    def audit_log(self) -> Path:
        return self.root / "logs" / "audit.log"

    @property
    def settings(self) -> dict[str, str]:
        return dict(json.loads((self.root / "cluster.json").read_text()))

    @property
    def server(self) -> str:
        return self.settings["server"]

    def log(self, component: str) -> Path:
        return self.root / "logs" / f"{component}.log"

    def component_kubeconfig(self, name: str) -> Path:
        return self.root / f"{name}.kubeconfig"


def _kubeconfig(path: Path, *, server: str, pki: Pki, name: str) -> None:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "drain-router-test", "cluster": {"server": server, "certificate-authority": str(pki.ca)}}
        ],
        "users": [
            {"name": name, "user": {"client-certificate": str(pki.cert(name)), "client-key": str(pki.key(name))}}
        ],
        "contexts": [{"name": "drain-router-test", "context": {"cluster": "drain-router-test", "user": name}}],
        "current-context": "drain-router-test",
    }
    path.write_text(json.dumps(config, indent=2) + "\n")


#: The components this process started: held so that they are not reported as leaked while they run
#: (they outlive their Popen objects on purpose: ``down`` stops them by their pid files).
_STARTED: list[subprocess.Popen[bytes]] = []


class _Launcher:
    """Starts one component in a session of its own with its output in ``logs/<name>.log`` and its
    pid in ``pids/<name>.pid``."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        (cluster.root / "logs").mkdir(parents=True, exist_ok=True)
        (cluster.root / "pids").mkdir(parents=True, exist_ok=True)

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        log = self.cluster.log(name).open("ab")
        child = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
            env={**os.environ, **(env or {})},
        )  # fmt: skip
        log.close()
        _STARTED.append(child)
        (self.cluster.root / "pids" / f"{name}.pid").write_text(f"{child.pid}\n")
        return child

    def tail(self, name: str, lines: int = 40) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.cluster.log(name).read_text(errors="replace").splitlines()[-lines:])
        return ""


def _wait(
    what: str, ready: object, child: subprocess.Popen[bytes], launcher: _Launcher, name: str, timeout: float
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if child.poll() is not None:
            raise ClusterFailed(f"{name} exited ({child.returncode}) before {what}:\n{launcher.tail(name)}")
        if callable(ready) and ready():
            return
        time.sleep(0.1)
    raise ClusterFailed(f"{name}: no {what} within {timeout:.0f} s:\n{launcher.tail(name)}")


def _api_ready(cluster: Cluster, server: str) -> bool:
    pki = cluster.pki
    context = ssl.create_default_context(cafile=str(pki.ca))
    context.load_cert_chain(str(pki.cert("admin")), str(pki.key("admin")))
    try:
        with urllib.request.urlopen(f"{server}/readyz", context=context, timeout=2) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


@contextlib.contextmanager
def machine_lock(timeout: float) -> Iterator[None]:
    """Hold the machine's one-cluster lock (released when the holder exits, whatever happens)."""
    LOCK.parent.mkdir(parents=True, exist_ok=True)
    handle = LOCK.open("a+")
    deadline = time.monotonic() + timeout
    while True:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise ClusterFailed(f"another test cluster runs on this machine ({LOCK}); stop it first") from None
            time.sleep(0.5)
    try:
        yield
    finally:
        handle.close()


def up(root: Path, *, node_agent: list[str] | None = None) -> Cluster:
    """Build what is missing, start every component, wait until each is ready, and write the admin
    kubeconfig. ``node_agent`` overrides the node agent's command (tests add flags)."""
    root = root.resolve()
    if CURRENT.exists():
        left = Path(CURRENT.read_text().strip())
        if left != root and (left / "pids").is_dir():
            down(left)
    if root.exists():
        down(root)
        shutil.rmtree(root)
    root.mkdir(parents=True)
    CURRENT.write_text(f"{root}\n")
    cluster = Cluster(root)
    bin_dir = binaries()
    kube, etcd = str(bin_dir / "kube"), str(bin_dir / "etcd")
    pki = cluster.pki
    pki.create(
        server_names=["localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
                      "kubernetes.default.svc.cluster.local"],
        server_ips=["127.0.0.1", BRIDGE.gateway, KUBERNETES_SERVICE_IP],
        clients=IDENTITIES,
    )  # fmt: skip
    etcd_port, etcd_peer, api_port = free_port(), free_port(), free_port()
    server = f"https://127.0.0.1:{api_port}"
    (root / "cluster.json").write_text(json.dumps({"server": server, "node": NODE, "bridge": BRIDGE.name}) + "\n")
    for identity in IDENTITIES:
        _kubeconfig(root / f"{identity.name}.kubeconfig", server=server, pki=pki, name=identity.name)
    shutil.copy(root / "admin.kubeconfig", cluster.kubeconfig)
    (root / "audit-policy.json").write_text(json.dumps(AUDIT_POLICY))
    BRIDGE.create()
    launcher = _Launcher(cluster)
    data = Path("/dev/shm") / f"drain-router-etcd-{os.getpid()}"
    (root / "etcd-data").write_text(f"{data}\n")
    etcd_url = f"http://127.0.0.1:{etcd_port}"
    child = launcher.start("etcd", [
        etcd, "--data-dir", str(data), "--unsafe-no-fsync", "--name", "test",
        "--listen-client-urls", etcd_url, "--advertise-client-urls", etcd_url,
        "--listen-peer-urls", f"http://127.0.0.1:{etcd_peer}",
        "--initial-advertise-peer-urls", f"http://127.0.0.1:{etcd_peer}",
        "--initial-cluster", f"test=http://127.0.0.1:{etcd_peer}", "--log-level", "warn",
    ])  # fmt: skip
    _wait("its client port", lambda: _port_open(etcd_port), child, launcher, "etcd", 30)
    child = launcher.start("apiserver", [
        kube, "apiserver",
        f"--etcd-servers={etcd_url}",
        "--bind-address=0.0.0.0", f"--secure-port={api_port}", f"--advertise-address={BRIDGE.gateway}",
        f"--tls-cert-file={pki.cert('apiserver')}", f"--tls-private-key-file={pki.key('apiserver')}",
        f"--client-ca-file={pki.ca}",
        "--authorization-mode=Node,RBAC", "--enable-admission-plugins=NodeRestriction",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
        f"--service-account-key-file={root / 'pki' / 'sa.pub'}",
        f"--service-account-signing-key-file={root / 'pki' / 'sa.key'}",
        "--allow-privileged=true",
        f"--audit-policy-file={root / 'audit-policy.json'}", f"--audit-log-path={cluster.audit_log}",
        "--audit-log-format=json",
        "--endpoint-reconciler-type=lease",
    ])  # fmt: skip
    _wait("/readyz 200", lambda: _api_ready(cluster, server), child, launcher, "apiserver", 120)
    launcher.start("controller-manager", [
        kube, "controller-manager",
        f"--kubeconfig={cluster.component_kubeconfig('controller-manager')}",
        f"--authentication-kubeconfig={cluster.component_kubeconfig('controller-manager')}",
        f"--authorization-kubeconfig={cluster.component_kubeconfig('controller-manager')}",
        "--leader-elect=false", "--use-service-account-credentials=true",
        f"--controllers={','.join(CONTROLLERS)}",
        f"--service-account-private-key-file={root / 'pki' / 'sa.key'}",
        f"--root-ca-file={pki.ca}", f"--service-cluster-ip-range={SERVICE_CIDR}",
        "--secure-port=0",
        "--concurrent-gc-syncs=5",
    ])  # fmt: skip
    launcher.start("scheduler", [
        kube, "scheduler",
        f"--kubeconfig={cluster.component_kubeconfig('scheduler')}",
        f"--authentication-kubeconfig={cluster.component_kubeconfig('scheduler')}",
        f"--authorization-kubeconfig={cluster.component_kubeconfig('scheduler')}",
        "--leader-elect=false", "--secure-port=0",
    ])  # fmt: skip
    launcher.start("proxy", [
        kube, "proxy",
        f"--kubeconfig={cluster.component_kubeconfig('proxy')}",
        f"--hostname-override={NODE}", "--proxy-mode=iptables", "--masquerade-all",
        f"--cluster-cidr={BRIDGE.subnet}", "--conntrack-max-per-core=0",
        f"--healthz-bind-address=127.0.0.1:{free_port()}", f"--metrics-bind-address=127.0.0.1:{free_port()}",
    ])  # fmt: skip
    agent = node_agent or [sys.executable, "-m", "drain_router_dev.kube.node"]
    launcher.start("node", [
        *agent, "--kubeconfig", str(cluster.component_kubeconfig("node")), "--node", NODE,
        "--bridge", BRIDGE.name, "--subnet", str(BRIDGE.subnet), "--state", str(root / "pods"),
    ])  # fmt: skip
    return cluster


def _port_open(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def down(root: Path) -> None:
    """Stop everything ``root``'s pid files name (the node agent first: it stops its pods), remove
    etcd's data and the node's network. Safe to run on a cluster already down."""
    pids = root / "pids"
    order = ["node", "proxy", "scheduler", "controller-manager", "apiserver", "etcd"]
    for name in order:
        path = pids / f"{name}.pid"
        if not path.exists():
            continue
        with contextlib.suppress(ValueError, ProcessLookupError, PermissionError):
            pid = int(path.read_text())
            os.killpg(pid, signal.SIGTERM)
            deadline = time.monotonic() + (20 if name == "node" else 10)
            while time.monotonic() < deadline and _alive(pid):
                time.sleep(0.05)
            if _alive(pid):
                os.killpg(pid, signal.SIGKILL)
        path.unlink()
    data = root / "etcd-data"
    if data.exists():
        shutil.rmtree(data.read_text().strip(), ignore_errors=True)
        data.unlink()
    remove_leftovers()
    _flush_proxy_rules()
    BRIDGE.delete()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie child of ours still answers kill(0); reap it if it is ours.
    with contextlib.suppress(ChildProcessError):
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return False
    return True


def _flush_proxy_rules() -> None:
    """kube-proxy's chains, as ``kube-proxy --cleanup`` would remove them."""
    kube = None
    with contextlib.suppress(ClusterFailed):
        kube = binaries() / "kube"
    if kube is not None:
        subprocess.run([str(kube), "proxy", "--cleanup"], capture_output=True, check=False)
