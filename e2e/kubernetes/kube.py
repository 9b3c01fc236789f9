"""The scenarios' view of the cluster: objects by kind and name, waits for a state, helm releases.

Waits poll the API server for the state itself (a pod Ready, an object gone) with a deadline; they
never sleep for a time in place of the event.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import os
import subprocess
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import yaml

from drain_router_dev.kube.api import Api, ApiError, Json
from drain_router_dev.kube.control_plane import Cluster

REPO = Path(__file__).resolve().parents[2]
MODEL_CHART = REPO / "charts" / "drain-router"
CONTROLLER_CHART = REPO / "charts" / "drain-router-controller"
GATEWAY_CRDS = REPO / "tests" / "chart" / "crds"

#: kind -> (API prefix, plural); namespaced unless listed in CLUSTER_SCOPED.
RESOURCES: dict[str, tuple[str, str]] = {
    "Pod": ("/api/v1", "pods"),
    "Service": ("/api/v1", "services"),
    "ServiceAccount": ("/api/v1", "serviceaccounts"),
    "Namespace": ("/api/v1", "namespaces"),
    "ConfigMap": ("/api/v1", "configmaps"),
    "Node": ("/api/v1", "nodes"),
    "Deployment": ("/apis/apps/v1", "deployments"),
    "ReplicaSet": ("/apis/apps/v1", "replicasets"),
    "EndpointSlice": ("/apis/discovery.k8s.io/v1", "endpointslices"),
    "NetworkPolicy": ("/apis/networking.k8s.io/v1", "networkpolicies"),
    "PodDisruptionBudget": ("/apis/policy/v1", "poddisruptionbudgets"),
    "Lease": ("/apis/coordination.k8s.io/v1", "leases"),
    "HTTPRoute": ("/apis/gateway.networking.k8s.io/v1", "httproutes"),
    "GRPCRoute": ("/apis/gateway.networking.k8s.io/v1", "grpcroutes"),
    "ReferenceGrant": ("/apis/gateway.networking.k8s.io/v1beta1", "referencegrants"),
    "ModelService": ("/apis/drainrouter.dev/v1alpha1", "modelservices"),
    "CustomResourceDefinition": ("/apis/apiextensions.k8s.io/v1", "customresourcedefinitions"),
}
CLUSTER_SCOPED = {"Namespace", "Node", "CustomResourceDefinition"}


def path(kind: str, namespace: str | None = None, name: str | None = None) -> str:
    prefix, plural = RESOURCES[kind]
    where = prefix if kind in CLUSTER_SCOPED or namespace is None else f"{prefix}/namespaces/{namespace}"
    return f"{where}/{plural}" + (f"/{name}" if name else "")


@dataclasses.dataclass
class Kube:
    """An admin client of the cluster plus the helpers every scenario needs."""

    cluster: Cluster
    api: Api

    async def get(self, kind: str, namespace: str | None, name: str) -> Json | None:
        status, found = await self.api.request("GET", path(kind, namespace, name), ok=(404,))
        return None if status == 404 else found

    async def list(self, kind: str, namespace: str | None = None, selector: str = "") -> list[Json]:
        query = f"?labelSelector={selector}" if selector else ""
        _, found = await self.api.request("GET", path(kind, namespace) + query)
        return list(found.get("items", []))

    async def apply(self, obj: Json, *, manager: str = "e2e") -> Json:
        """Server-side apply, as ``kubectl apply --server-side`` sends it."""
        meta = obj["metadata"]
        where = path(obj["kind"], meta.get("namespace"), meta["name"]) + f"?fieldManager={manager}&force=true"
        _, applied = await self.api.request("PATCH", where, obj, content_type="application/apply-patch+yaml")
        return applied

    async def patch(self, kind: str, namespace: str | None, name: str, body: Json, *, subresource: str = "") -> Json:
        where = path(kind, namespace, name) + (f"/{subresource}" if subresource else "")
        _, patched = await self.api.request("PATCH", where, body, content_type="application/merge-patch+json")
        return patched

    async def delete(self, kind: str, namespace: str | None, name: str, **options: Any) -> None:
        body = {"kind": "DeleteOptions", "apiVersion": "v1", **options} if options else None
        await self.api.request("DELETE", path(kind, namespace, name), body, ok=(404,))

    async def wait(self, what: str, check: Callable[[], Awaitable[Any]], timeout: float = 60.0) -> Any:
        """Poll ``check`` until it returns something true; that value. ``what`` names the state."""
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            last = await check()
            if last:
                return last
            await asyncio.sleep(0.1)
        raise AssertionError(f"not reached within {timeout:.0f} s: {what} (last: {str(last)[:400]})")

    async def ready_pods(self, namespace: str, selector: str) -> list[Json]:
        return [p for p in await self.list("Pod", namespace, selector) if is_ready(p)]

    async def wait_gone(self, kind: str, namespace: str | None, name: str, timeout: float = 60.0) -> None:
        async def gone() -> bool:
            return await self.get(kind, namespace, name) is None

        await self.wait(f"{kind} {namespace}/{name} deleted", gone, timeout)

    async def create_namespace(self, name: str) -> None:
        await self.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})


def is_ready(pod: Json) -> bool:
    if pod["metadata"].get("deletionTimestamp"):
        return False
    conditions = pod.get("status", {}).get("conditions", [])
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


@dataclasses.dataclass(frozen=True)
class Helm:
    """The real helm binary against the cluster's admin kubeconfig, with throwaway helm state."""

    binary: Path
    home: Path
    kubeconfig: Path

    def run(self, *args: str, timeout: float = 300) -> str:
        env = {
            **os.environ,
            "KUBECONFIG": str(self.kubeconfig),
            "HELM_CACHE_HOME": str(self.home / "cache"),
            "HELM_CONFIG_HOME": str(self.home / "config"),
            "HELM_DATA_HOME": str(self.home / "data"),
        }
        done = subprocess.run([str(self.binary), *args], capture_output=True, text=True, timeout=timeout, env=env)
        if done.returncode != 0:
            raise AssertionError(f"helm {' '.join(args[:3])} failed: {done.stderr.strip()[-2000:]}")
        return done.stdout

    def install(self, release: str, chart: Path, namespace: str, values: Json, *, wait: bool = True) -> None:
        values_file = self.home / f"{namespace}-{release}.yaml"
        values_file.write_text(yaml.safe_dump(values))
        args = [
            "upgrade",
            "--install",
            release,
            str(chart),
            "-n",
            namespace,
            "--create-namespace",
            "-f",
            str(values_file),
        ]
        if wait:
            args += ["--wait", "--timeout", "180s"]
        self.run(*args)

    def uninstall(self, release: str, namespace: str, *, wait: bool = True) -> None:
        args = ["uninstall", release, "-n", namespace, "--ignore-not-found"]
        if wait:
            args += ["--wait", "--timeout", "180s"]
        self.run(*args)


async def restart(kube: Kube, namespace: str, deployment: str) -> int:
    """``kubectl rollout restart``: the annotation it writes; the generation that rollout is."""
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    patched = await kube.patch(
        "Deployment", namespace, deployment,
        {"spec": {"template": {"metadata": {"annotations": {"kubectl.kubernetes.io/restartedAt": stamp}}}}},
    )  # fmt: skip
    return int(patched["metadata"]["generation"])


async def rolled_out(kube: Kube, namespace: str, deployment: str, generation: int, replicas: int) -> None:
    """The rollout of ``generation`` complete, as ``kubectl rollout status`` judges it, and every old
    pod gone."""

    async def done() -> bool:
        found = await kube.get("Deployment", namespace, deployment)
        assert found is not None
        status = found.get("status", {})
        complete = (
            status.get("observedGeneration", 0) >= generation
            and status.get("updatedReplicas") == replicas
            and status.get("availableReplicas") == replicas
            and status.get("replicas") == replicas
        )
        selector = ",".join(f"{k}={v}" for k, v in found["spec"]["selector"]["matchLabels"].items())
        pods = await kube.list("Pod", namespace, selector)
        return complete and len(pods) == replicas

    await kube.wait(f"rollout of {namespace}/{deployment} generation {generation}", done, timeout=240)


def load_yaml_dir(directory: Path) -> list[Json]:
    docs: list[Json] = []
    for file in sorted(directory.glob("*.yaml")):
        docs.extend(doc for doc in yaml.safe_load_all(file.read_text()) if doc)
    return docs


__all__ = ["Api", "ApiError", "Helm", "Json", "Kube", "is_ready", "load_yaml_dir", "path", "restart", "rolled_out"]
