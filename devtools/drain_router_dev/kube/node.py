"""The node agent: the smallest honest stand-in for the kubelet on a machine with no container runtime.

It registers a Node (Ready, with a Lease heartbeat), runs the containers of each pod the scheduler
binds to it as local processes (:mod:`drain_router_dev.kube.images` says which program an image is),
each pod in a network namespace of its own with an address on the node's bridge, and does what the
kubelet does that the scenarios depend on:

- volumes: the projected service-account token (a bound token from the TokenRequest API, the
  cluster's CA from ``kube-root-ca.crt``, the namespace), ``configMap``, ``secret`` and ``emptyDir``,
  bind-mounted at their ``mountPath`` in a mount namespace of the container's own;
- environment: ``env`` values and the downward API's ``fieldRef`` fields, and
  ``KUBERNETES_SERVICE_HOST``/``PORT`` (the ``kubernetes`` Service's ClusterIP);
- startup, readiness and liveness probes (``httpGet``, ``tcpSocket``, ``exec``), restarts with the
  kubelet's back-off, and the pod's status (IP, phase, conditions, container states);
- termination: the preStop hook (``exec``, ``httpGet``, ``sleep``), SIGTERM, the grace period,
  SIGKILL; then the final delete.

What it does not do: pull images, enforce resources or security contexts (containers run as this
agent's user), service-link environment variables, logs and exec through the API, token refresh
(tokens are asked for with the kubelet's hour), init containers and sidecar restart policies.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import datetime
import functools
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import quote

import aiohttp
import click

from drain_router_dev.kube import images
from drain_router_dev.kube.api import Api, Json
from drain_router_dev.kube.network import Bridge, PodNetwork, ip

log = logging.getLogger("node")

NETNS_PREFIX = "drk-"
KUBELET_VERSION = "v1.37.2"
LEASE_SECS = 40
HEARTBEAT_SECS = 10.0
BACKOFF_FIRST_SECS = 10.0
BACKOFF_MAX_SECS = 300.0
TOKEN_SECS = 3607


def now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def micro_now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def remove_leftovers() -> None:
    """Remove every pod network namespace an agent left behind (killed, or a machine reused)."""
    listed = ip("netns", "list", check=False).stdout.split()
    for name in listed:
        if name.startswith(NETNS_PREFIX):
            ip("netns", "pids", name, check=False)
            for pid in ip("netns", "pids", name, check=False).stdout.split():
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid), signal.SIGKILL)
            ip("netns", "del", name, check=False)
    for line in ip("-o", "link", "show", check=False).stdout.splitlines():
        parts = line.split(":")
        if len(parts) > 1 and parts[1].strip().startswith("v" + NETNS_PREFIX[:-1]):
            ip("link", "del", parts[1].strip().split("@")[0], check=False)


@dataclasses.dataclass
class ContainerRun:
    """One container of a pod: its process, state and probe results."""

    spec: Json
    process: asyncio.subprocess.Process | None = None
    started_at: str | None = None
    finished_at: str | None = None
    exit_code: int | None = None
    restarts: int = 0
    ready: bool = False
    started: bool = False
    waiting: str = "ContainerCreating"
    message: str = ""
    log_path: Path | None = None

    @property
    def name(self) -> str:
        return str(self.spec["name"])

    def status(self, image: str) -> Json:
        state: Json
        if self.process is not None and self.exit_code is None:
            state = {"running": {"startedAt": self.started_at}}
        elif self.exit_code is not None and self.waiting == "":
            state = {"terminated": {"exitCode": self.exit_code, "reason": "Completed" if self.exit_code == 0 else "Error",
                                    "startedAt": self.started_at, "finishedAt": self.finished_at}}  # fmt: skip
        else:
            state = {"waiting": {"reason": self.waiting, **({"message": self.message} if self.message else {})}}
        return {
            "name": self.name, "image": image, "imageID": f"drain-router-node://{images.repository(image)}",
            "containerID": f"process://{self.process.pid}" if self.process else "",
            "ready": self.ready, "started": self.started, "restartCount": self.restarts, "state": state,
        }  # fmt: skip


class PodRun:
    """One pod on this node, from its network namespace to its final delete."""

    def __init__(self, agent: Agent, pod: Json, address: str) -> None:
        self.agent = agent
        self.pod = pod
        meta = pod["metadata"]
        self.uid: str = meta["uid"]
        self.key = f"{meta['namespace']}/{meta['name']}"
        self.network = PodNetwork(NETNS_PREFIX + self.uid.replace("-", "")[:10], address, agent.bridge)
        self.dir = agent.state / f"{meta['namespace']}_{meta['name']}_{self.uid[:8]}"
        self.containers = [ContainerRun(c) for c in pod["spec"].get("containers", [])]
        self.deleting = asyncio.Event()
        self.terminated = False
        self.task: asyncio.Task[None] | None = None
        self.dirty = asyncio.Event()

    @property
    def spec(self) -> Json:
        return dict(self.pod["spec"])

    # -- status -------------------------------------------------------------------------------------
    def status(self) -> Json:
        all_ready = bool(self.containers) and all(c.ready for c in self.containers)
        phase = "Running"
        if self.terminated:
            codes = [c.exit_code for c in self.containers]
            phase = "Succeeded" if all(code == 0 for code in codes) else "Failed"
        elif not any(c.process for c in self.containers):
            phase = "Pending"
        stamp = now()

        def condition(kind: str, value: bool) -> Json:
            return {"type": kind, "status": "True" if value else "False", "lastTransitionTime": stamp}

        return {
            "phase": phase,
            "hostIP": self.agent.bridge.gateway,
            "hostIPs": [{"ip": self.agent.bridge.gateway}],
            "podIP": self.network.address,
            "podIPs": [{"ip": self.network.address}],
            "startTime": self.pod.get("status", {}).get("startTime") or stamp,
            "conditions": [
                condition("PodReadyToStartContainers", True),
                condition("Initialized", True),
                condition("ContainersReady", all_ready and not self.terminated),
                condition("Ready", all_ready and not self.terminated),
            ],
            "containerStatuses": [c.status(c.spec.get("image", "")) for c in self.containers],
        }

    async def report(self) -> None:
        """Write the status whenever something changed (coalesced: one write in flight)."""
        last: str | None = None
        while True:
            await self.dirty.wait()
            self.dirty.clear()
            status = self.status()
            compact = json.dumps({k: v for k, v in status.items() if k not in ("conditions",)}, sort_keys=True)
            compact += json.dumps([(c["type"], c["status"]) for c in status["conditions"]])
            if compact == last:
                continue
            # Transition times move only when the status does.
            try:
                await self.agent.api.patch_status(self.pod, status)
                last = compact
            except (aiohttp.ClientError, RuntimeError, TimeoutError) as exc:
                log.warning("%s: status not written: %s", self.key, exc)
                self.dirty.set()
                await asyncio.sleep(1)

    def changed(self) -> None:
        self.dirty.set()

    # -- life ---------------------------------------------------------------------------------------
    async def run(self) -> None:
        reporter = asyncio.create_task(self.report())
        try:
            await self._run()
        except Exception:
            log.exception("%s: failed", self.key)
            raise
        finally:
            self.changed()
            await self._flush(reporter)

    async def _flush(self, reporter: asyncio.Task[None]) -> None:
        with contextlib.suppress(Exception):
            await self.agent.api.patch_status(self.pod, self.status())
        reporter.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reporter

    async def _run(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        await asyncio.to_thread(self.network.create)
        log.info("%s: network %s at %s", self.key, self.network.namespace, self.network.address)
        mounts = await self._volumes()
        env = await self._service_env()
        self.changed()
        loops = [asyncio.create_task(self._container(c, mounts, env)) for c in self.containers]
        await self.deleting.wait()
        await self._terminate()
        for loop in loops:
            loop.cancel()
        await asyncio.gather(*loops, return_exceptions=True)
        self.terminated = True
        self.changed()
        await self.agent.api.patch_status(self.pod, self.status())
        meta = self.pod["metadata"]
        await self.agent.api.request(
            "DELETE", f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}",
            {"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 0, "preconditions": {"uid": self.uid}},
            ok=(404, 409),
        )  # fmt: skip
        await asyncio.to_thread(self.network.delete)
        log.info("%s: stopped; %s removed", self.key, self.network.address)
        # The kubelet removes the pod's volumes; its containers' logs stay for the post-mortem.
        await asyncio.to_thread(shutil.rmtree, self.dir / "volumes", True)

    # -- volumes and environment --------------------------------------------------------------------
    async def _volumes(self) -> dict[str, Path]:
        """Each volume's contents in a directory of its own: name -> directory."""
        found: dict[str, Path] = {}
        for volume in self.spec.get("volumes", []):
            where = self.dir / "volumes" / volume["name"]
            where.mkdir(parents=True, exist_ok=True)
            if "projected" in volume:
                for source in volume["projected"].get("sources", []):
                    await self._project(source, where)
            elif "configMap" in volume:
                await self._config_map(volume["configMap"]["name"], volume["configMap"].get("items"), where)
            elif "secret" in volume:
                await self._secret(volume["secret"]["secretName"], volume["secret"].get("items"), where)
            elif "emptyDir" not in volume:
                log.warning("%s: volume %s of an unsupported kind is an empty directory", self.key, volume["name"])
            found[volume["name"]] = where
        return found

    async def _project(self, source: Json, where: Path) -> None:
        meta = self.pod["metadata"]
        if "serviceAccountToken" in source:
            token = source["serviceAccountToken"]
            body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {
                "audiences": [token["audience"]] if token.get("audience") else None,
                "expirationSeconds": token.get("expirationSeconds", TOKEN_SECS),
                "boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": meta["name"], "uid": self.uid},
            }}  # fmt: skip
            account = self.spec.get("serviceAccountName", "default")
            _, answer = await self.agent.api.request(
                "POST", f"/api/v1/namespaces/{meta['namespace']}/serviceaccounts/{account}/token", body
            )
            (where / token["path"]).write_text(answer["status"]["token"])
        elif "configMap" in source:
            await self._config_map(source["configMap"]["name"], source["configMap"].get("items"), where)
        elif "secret" in source:
            await self._secret(source["secret"]["name"], source["secret"].get("items"), where)
        elif "downwardAPI" in source:
            for item in source["downwardAPI"].get("items", []):
                (where / item["path"]).write_text(self._field(item["fieldRef"]["fieldPath"]))

    async def _config_map(self, name: str, items: list[Json] | None, where: Path) -> None:
        ns = self.pod["metadata"]["namespace"]
        _, found = await self.agent.api.request("GET", f"/api/v1/namespaces/{ns}/configmaps/{name}")
        self._write(found.get("data", {}), items, where)

    async def _secret(self, name: str, items: list[Json] | None, where: Path) -> None:
        ns = self.pod["metadata"]["namespace"]
        _, found = await self.agent.api.request("GET", f"/api/v1/namespaces/{ns}/secrets/{name}")
        data = {k: base64.b64decode(v).decode() for k, v in found.get("data", {}).items()}
        self._write(data, items, where)

    @staticmethod
    def _write(data: dict[str, str], items: list[Json] | None, where: Path) -> None:
        chosen = [(item["key"], item["path"]) for item in items] if items else [(k, k) for k in data]
        for key, path in chosen:
            target = where / path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(data[key])

    def _field(self, path: str) -> str:
        meta = self.pod["metadata"]
        fields = {
            "metadata.name": meta["name"], "metadata.namespace": meta["namespace"], "metadata.uid": self.uid,
            "spec.nodeName": self.agent.node, "spec.serviceAccountName": self.spec.get("serviceAccountName", ""),
            "status.podIP": self.network.address, "status.hostIP": self.agent.bridge.gateway,
        }  # fmt: skip
        if path.startswith("metadata.labels['") or path.startswith("metadata.annotations['"):
            kind, key = path.split("['", 1)
            return str(meta.get(kind.split(".")[1], {}).get(key.rstrip("']"), ""))
        return str(fields.get(path, ""))

    async def _service_env(self) -> dict[str, str]:
        _, service = await self.agent.api.request("GET", "/api/v1/namespaces/default/services/kubernetes")
        port = service["spec"]["ports"][0]["port"]
        return {"KUBERNETES_SERVICE_HOST": service["spec"]["clusterIP"], "KUBERNETES_SERVICE_PORT": str(port),
                "KUBERNETES_SERVICE_PORT_HTTPS": str(port), "HOSTNAME": self.pod["metadata"]["name"]}  # fmt: skip

    def _environment(self, container: Json, base: dict[str, str]) -> dict[str, str]:
        env = {"PATH": f"{images.BIN}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}", "HOME": "/root", **base}
        for item in container.get("env", []):
            if "value" in item:
                env[item["name"]] = item["value"]
            elif "fieldRef" in item.get("valueFrom", {}):
                env[item["name"]] = self._field(item["valueFrom"]["fieldRef"]["fieldPath"])
            elif "resourceFieldRef" in item.get("valueFrom", {}):
                env[item["name"]] = "0"
        return env

    # -- containers ---------------------------------------------------------------------------------
    def _launch(self, container: ContainerRun, mounts: dict[str, Path], argv: list[str]) -> list[str]:
        """``argv`` run in the pod's network namespace, with the container's volumes bind-mounted in
        a mount namespace of its own (``ip netns exec`` makes one)."""
        script = []
        for mount in container.spec.get("volumeMounts", []):
            source = mounts.get(mount["name"])
            if source is None:
                continue
            if mount.get("subPath"):
                source = source / mount["subPath"]
            target = mount["mountPath"]
            script.append(f"mkdir -p {_quote(target)} && mount --bind {_quote(str(source))} {_quote(target)}")
            if mount.get("readOnly"):
                script.append(f"mount -o remount,bind,ro {_quote(target)}")
        script.append('exec "$@"')
        return [*self.network.enter(), "sh", "-c", " && ".join(script), "sh", *argv]

    async def _container(self, container: ContainerRun, mounts: dict[str, Path], env: dict[str, str]) -> None:
        spec = container.spec
        backoff = BACKOFF_FIRST_SECS
        while not self.deleting.is_set():
            try:
                argv = images.argv(spec.get("image", ""), spec.get("command", []), spec.get("args", []))
            except images.UnknownImage as exc:
                container.waiting, container.message = "ErrImagePull", str(exc)
                self.changed()
                await self.deleting.wait()
                return
            container.log_path = self.dir / f"{container.name}.log"
            with container.log_path.open("ab") as out:
                container.process = await asyncio.create_subprocess_exec(
                    *self._launch(container, mounts, argv), stdout=out, stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL, env=self._environment(spec, env), start_new_session=True,
                    cwd=spec.get("workingDir") or None,
                )  # fmt: skip
            container.started_at, container.exit_code, container.waiting, container.message = now(), None, "", ""
            container.ready = container.started = False
            self.changed()
            started_clock = time.monotonic()
            probes = asyncio.create_task(self._probe(container))
            code = await container.process.wait()
            probes.cancel()
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(container.process.pid, signal.SIGKILL)
            container.exit_code, container.finished_at = code, now()
            container.ready = False
            self.changed()
            if self.deleting.is_set() or self.spec.get("restartPolicy", "Always") == "Never":
                return
            if self.spec.get("restartPolicy") == "OnFailure" and code == 0:
                return
            log.info("%s: container %s exited %s; restarting in %.0f s", self.key, container.name, code, backoff)
            if time.monotonic() - started_clock > 600:
                backoff = BACKOFF_FIRST_SECS
            container.waiting = "CrashLoopBackOff"
            self.changed()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.deleting.wait(), backoff)
            backoff = min(backoff * 2, BACKOFF_MAX_SECS)
            container.restarts += 1

    async def _probe(self, container: ContainerRun) -> None:
        """Startup first; then readiness and liveness side by side, until the container exits."""
        spec = container.spec
        startup = spec.get("startupProbe")
        if startup is not None and not await self._until(container, startup, want=True):
            await self._restart(container, "startup probe failed")
            return
        container.started = True
        if spec.get("readinessProbe") is None:
            container.ready = True
        self.changed()
        loops = [self._readiness(container, spec["readinessProbe"])] if spec.get("readinessProbe") else []
        if spec.get("livenessProbe") is not None:
            loops.append(self._liveness(container, spec["livenessProbe"]))
        if loops:
            await asyncio.gather(*loops)

    async def _until(self, container: ContainerRun, probe: Json, *, want: bool) -> bool:
        await asyncio.sleep(probe.get("initialDelaySeconds", 0))
        failures, threshold = 0, probe.get("failureThreshold", 3)
        while True:
            if await self._check(container, probe):
                return True
            failures += 1
            if failures >= threshold:
                return False
            await asyncio.sleep(probe.get("periodSeconds", 10))

    async def _readiness(self, container: ContainerRun, probe: Json) -> None:
        await asyncio.sleep(probe.get("initialDelaySeconds", 0))
        successes = failures = 0
        while True:
            if await self._check(container, probe):
                successes, failures = successes + 1, 0
                if successes >= probe.get("successThreshold", 1) and not container.ready:
                    container.ready = True
                    self.changed()
            else:
                successes, failures = 0, failures + 1
                if failures >= probe.get("failureThreshold", 3) and container.ready:
                    container.ready = False
                    self.changed()
            await asyncio.sleep(probe.get("periodSeconds", 10))

    async def _liveness(self, container: ContainerRun, probe: Json) -> None:
        await asyncio.sleep(probe.get("initialDelaySeconds", 0))
        failures = 0
        while not self.deleting.is_set():
            failures = 0 if await self._check(container, probe) else failures + 1
            if failures >= probe.get("failureThreshold", 3):
                await self._restart(container, "liveness probe failed")
                return
            await asyncio.sleep(probe.get("periodSeconds", 10))

    async def _restart(self, container: ContainerRun, why: str) -> None:
        log.info("%s: %s: %s; stopping it", self.key, container.name, why)
        if not self.deleting.is_set():
            await self._stop(container, self._grace(None), hook=False)

    async def _check(self, container: ContainerRun, probe: Json) -> bool:
        timeout = float(probe.get("timeoutSeconds", 1))
        try:
            return await asyncio.wait_for(self._action(container, probe), timeout)
        except (TimeoutError, OSError, aiohttp.ClientError):
            return False

    async def _action(self, container: ContainerRun, action: Json) -> bool:
        if "httpGet" in action:
            get = action["httpGet"]
            port = self._port(container, get["port"])
            scheme = get.get("scheme", "HTTP").lower()
            host = get.get("host") or self.network.address
            headers = {h["name"]: h["value"] for h in get.get("httpHeaders", [])}
            async with self.agent.probes.get(f"{scheme}://{host}:{port}{get.get('path', '/')}", headers=headers,
                                             ssl=False, allow_redirects=False) as resp:  # fmt: skip
                await resp.read()
                return 200 <= resp.status < 400
        if "tcpSocket" in action:
            port = self._port(container, action["tcpSocket"]["port"])
            _, writer = await asyncio.open_connection(self.network.address, port)
            writer.close()
            return True
        if "exec" in action:
            child = await asyncio.create_subprocess_exec(
                *self.network.enter(), *action["exec"]["command"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
            )  # fmt: skip
            try:
                return await child.wait() == 0
            finally:
                if child.returncode is None:
                    os.killpg(child.pid, signal.SIGKILL)
                    await child.wait()
        if "sleep" in action:
            await asyncio.sleep(action["sleep"]["seconds"])
            return True
        return False

    def _port(self, container: ContainerRun, port: int | str) -> int:
        if isinstance(port, int) or str(port).isdigit():
            return int(port)
        for candidate in self.containers:
            for named in candidate.spec.get("ports", []):
                if named.get("name") == port:
                    return int(named["containerPort"])
        raise OSError(f"no container port named {port!r}")

    # -- termination --------------------------------------------------------------------------------
    def _grace(self, given: int | None) -> float:
        if given is not None:
            return float(given)
        return float(self.spec.get("terminationGracePeriodSeconds", 30))

    async def _terminate(self) -> None:
        grace = self._grace(self.pod["metadata"].get("deletionGracePeriodSeconds"))
        log.info("%s: terminating, grace %.0f s", self.key, grace)
        await asyncio.gather(*(self._stop(c, grace, hook=True) for c in self.containers))

    async def _stop(self, container: ContainerRun, grace: float, *, hook: bool) -> None:
        """The kubelet's order: preStop (within the grace), SIGTERM, the rest of the grace, SIGKILL."""
        process = container.process
        if process is None or process.returncode is not None:
            return
        deadline = time.monotonic() + grace
        pre_stop = container.spec.get("lifecycle", {}).get("preStop")
        if hook and pre_stop is not None:
            try:
                await asyncio.wait_for(self._action(container, pre_stop), max(grace, 0.0))
            except (TimeoutError, OSError, aiohttp.ClientError) as exc:
                log.info("%s: %s: preStop hook: %r", self.key, container.name, exc)
        if process.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)
        # Like the kubelet, a preStop hook that used the whole grace leaves a short last chance.
        remaining = max(deadline - time.monotonic(), 2.0)
        try:
            await asyncio.wait_for(asyncio.shield(process.wait()), remaining)
        except TimeoutError:
            log.info("%s: %s still running after the grace: SIGKILL", self.key, container.name)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            await process.wait()

    async def kill(self) -> None:
        """The agent is going (the cluster stops): every container ends now."""
        for container in self.containers:
            if container.process is not None and container.process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(container.process.pid, signal.SIGKILL)
        await asyncio.to_thread(self.network.delete)


def _quote(word: str) -> str:
    return "'" + word.replace("'", "'\\''") + "'"


class Agent:
    """The node: its registration and heartbeat, and the pods bound to it, by uid."""

    def __init__(self, api: Api, node: str, bridge: Bridge, state: Path) -> None:
        self.api = api
        self.node = node
        self.bridge = bridge
        self.state = state
        self.pods: dict[str, PodRun] = {}
        self.used: set[int] = set()
        self.last = 0
        self.chores: set[asyncio.Task[None]] = set()
        self.probes = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None))

    async def register(self) -> None:
        labels = {"kubernetes.io/hostname": self.node, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64"}
        node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": self.node, "labels": labels}, "spec": {}}
        await self.api.request("POST", "/api/v1/nodes", node, ok=(409,))
        await self.heartbeat_status()

    async def heartbeat_status(self) -> None:
        stamp = now()
        # Declared, not measured: the scheduler fits pods against it; the stand-in enforces nothing.
        capacity = {"cpu": "64", "memory": "256Gi", "pods": "110", "ephemeral-storage": "100Gi"}
        status = {"status": {
            "capacity": capacity, "allocatable": capacity,
            "conditions": [
                {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "node agent is posting ready status",
                 "lastHeartbeatTime": stamp, "lastTransitionTime": stamp},
                *({"type": kind, "status": "False", "reason": "KubeletHasSufficient", "lastHeartbeatTime": stamp,
                   "lastTransitionTime": stamp} for kind in ("MemoryPressure", "DiskPressure", "PIDPressure")),
            ],
            "addresses": [{"type": "InternalIP", "address": self.bridge.gateway}, {"type": "Hostname", "address": self.node}],
            "nodeInfo": {"kubeletVersion": KUBELET_VERSION, "kubeProxyVersion": KUBELET_VERSION, "operatingSystem": "linux",
                         "architecture": "amd64", "containerRuntimeVersion": "drain-router-node://0",
                         "osImage": "drain-router node agent", "kernelVersion": os.uname().release,
                         "machineID": "", "systemUUID": "", "bootID": ""},
        }}  # fmt: skip
        await self.api.request("PATCH", f"/api/v1/nodes/{self.node}/status", status,
                               content_type="application/strategic-merge-patch+json")  # fmt: skip

    async def lease(self) -> None:
        path = f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{self.node}"
        while True:
            body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {"name": self.node, "namespace": "kube-node-lease"},
                    "spec": {"holderIdentity": self.node, "leaseDurationSeconds": LEASE_SECS, "renewTime": micro_now()}}  # fmt: skip
            try:
                status, found = await self.api.request("GET", path, ok=(404,))
                if status == 404:
                    await self.api.request("POST", path.rsplit("/", 1)[0], body, ok=(409,))
                else:
                    found["spec"].update(body["spec"])
                    await self.api.request("PUT", path, found, ok=(409,))
                await self.heartbeat_status()
            except (aiohttp.ClientError, RuntimeError, TimeoutError) as exc:
                log.warning("lease not renewed: %s", exc)
            await asyncio.sleep(HEARTBEAT_SECS)

    def _address(self) -> str:
        """The next free address after the last one given, as an IPAM hands them out: an address
        just freed is not given again at once (peers may still hold its old MAC in their ARP cache)."""
        for step in range(1, 250):
            index = (self.last + step - 1) % 249 + 1
            if index not in self.used:
                self.used.add(index)
                self.last = index
                return self.bridge.pod_address(index)
        raise RuntimeError("no pod address left on this node")

    def _release(self, run: PodRun) -> None:
        self.used.discard(int(run.network.address.rsplit(".", 1)[1]) - 1)

    def seen(self, pod: Json) -> None:
        """A pod bound to this node, as the watch last saw it."""
        uid = pod["metadata"]["uid"]
        run = self.pods.get(uid)
        if pod.get("status", {}).get("phase") in ("Succeeded", "Failed") and run is None:
            return
        if run is None:
            if pod["metadata"].get("deletionTimestamp"):
                # Never started here: nothing to stop.
                forget = asyncio.create_task(self._forget(pod))
                self.chores.add(forget)
                forget.add_done_callback(self.chores.discard)
                return
            run = PodRun(self, pod, self._address())
            self.pods[uid] = run
            run.task = asyncio.create_task(run.run())
            run.task.add_done_callback(functools.partial(self._done, run))
        run.pod = pod
        if pod["metadata"].get("deletionTimestamp"):
            run.deleting.set()

    def gone(self, pod: Json) -> None:
        run = self.pods.get(pod["metadata"]["uid"])
        if run is not None:
            run.pod = pod
            run.deleting.set()

    def _done(self, run: PodRun, _task: asyncio.Task[None]) -> None:
        self.pods.pop(run.uid, None)
        self._release(run)

    async def _forget(self, pod: Json) -> None:
        meta = pod["metadata"]
        await self.api.request(
            "DELETE", f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}",
            {"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 0, "preconditions": {"uid": meta["uid"]}},
            ok=(404, 409),
        )  # fmt: skip

    async def watch(self) -> None:
        selector = quote(f"spec.nodeName={self.node}")
        while True:
            try:
                _, listed = await self.api.request("GET", f"/api/v1/pods?fieldSelector={selector}")
                for pod in listed.get("items", []):
                    self.seen(pod)
                # A pod deleted while the watch was down is not in the list: it ends here too.
                present = {pod["metadata"]["uid"] for pod in listed.get("items", [])}
                for uid, run in list(self.pods.items()):
                    if uid not in present:
                        run.deleting.set()
                version = listed["metadata"]["resourceVersion"]
                url = (f"{self.api.server}/api/v1/pods?fieldSelector={selector}&watch=true"
                       f"&allowWatchBookmarks=true&resourceVersion={version}&timeoutSeconds=300")  # fmt: skip
                async with self.api.session.get(url, timeout=aiohttp.ClientTimeout(total=None, sock_read=400)) as resp:
                    async for line in resp.content:
                        event = json.loads(line)
                        kind, obj = event["type"], event["object"]
                        if kind == "ERROR":
                            break
                        if kind in ("ADDED", "MODIFIED"):
                            self.seen(obj)
                        elif kind == "DELETED":
                            self.gone(obj)
            except (aiohttp.ClientError, RuntimeError, TimeoutError, ValueError) as exc:
                log.warning("pod watch: %s", exc)
                await asyncio.sleep(1)

    async def stop(self) -> None:
        await asyncio.gather(*(run.kill() for run in self.pods.values()))
        await self.probes.close()


async def serve(kubeconfig: Path, node: str, bridge: Bridge, state: Path) -> None:
    await asyncio.to_thread(remove_leftovers)
    state.mkdir(parents=True, exist_ok=True)
    api = Api(kubeconfig)
    agent = Agent(api, node, bridge, state)
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    await agent.register()
    log.info("node %s registered", node)
    tasks = [asyncio.create_task(agent.lease()), asyncio.create_task(agent.watch())]
    await stopping.wait()
    for task in tasks:
        task.cancel()
    await agent.stop()
    await api.close()


@click.command()
@click.option("--kubeconfig", type=click.Path(exists=True, path_type=Path), required=True)
@click.option("--node", default="node-1", show_default=True)
@click.option("--bridge", "bridge_name", default="drk0", show_default=True)
@click.option("--subnet", default="10.244.0.0/24", show_default=True)
@click.option("--state", type=click.Path(path_type=Path), required=True, help="Pods' volumes and logs.")
def main(kubeconfig: Path, node: str, bridge_name: str, subnet: str, state: Path) -> None:
    """Run the node agent in the foreground until SIGTERM."""
    import ipaddress

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr)
    asyncio.run(serve(kubeconfig, node, Bridge(bridge_name, ipaddress.IPv4Network(subnet)), state))


if __name__ == "__main__":
    main()
