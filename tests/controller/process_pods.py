"""Process-backed pods: the emulator's Deployment controller creates pods, and this kubelet stand-in
runs a real ``drain-router serve`` for each one, bound to the pod's own loopback ``podIP``
(127.0.0.2, .3, ...) on the ModelService's admin port, in front of one shared
``drain-router-dev fake-model``. A pod turns Ready once its router listens. When the pod is deleted
(an eviction is a graceful delete), the router gets SIGTERM, exactly as a kubelet sends it; when the
process exits the pod is removed, and its exit status is kept for the test. At the end of the
pod's grace the emulator's kubelet removes the pod and a router still running is SIGKILLed.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import sys
from collections.abc import AsyncIterator
from typing import Any

import kmock

from drain_router_dev import process as process_
from tests.process import RouterProcess, log_path

from .emulator import ClusterEmulator


@dataclasses.dataclass
class PodProcess:
    name: str
    uid: str
    ip: str
    router: RouterProcess
    exit_code: int | None = None
    sigterm_sent: bool = False


class ProcessKubelet:
    def __init__(
        self,
        emulator: ClusterEmulator,
        *,
        upstream: str,
        admin_port: int,
        main_port: int,
        router_args: tuple[str, ...] = (),
    ) -> None:
        self.emulator = emulator
        self.upstream, self.admin_port, self.main_port = upstream, admin_port, main_port
        self.router_args = router_args
        self.cold_start = asyncio.Event()
        """Set: a new pod's router starts at once. Cleared: it starts only once set (the image pull
        and weight loading of a real cold start, as long as a test needs)."""
        self.cold_start.set()
        self.pods: dict[str, PodProcess] = {}
        """uid -> the pod's router."""
        self._tasks: set[asyncio.Task[Any]] = set()
        self._starting: set[asyncio.Future[RouterProcess]] = set()
        emulator.on_pod_created = self._created
        emulator.pod_may_be_ready = self._may_be_ready
        emulator.on_pod_deleted = self._deleted
        emulator.on_pod_removed = self._removed

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _created(self, pod: dict[str, Any]) -> None:
        self._spawn(
            self._run(
                pod["metadata"]["name"], pod["metadata"]["uid"], pod["metadata"]["namespace"], pod["status"]["podIP"]
            )
        )

    async def _run(self, name: str, uid: str, namespace: str, ip: str) -> None:
        await self.cold_start.wait()
        # Shielded: a cancellation while the process is being spawned would leave it running
        # unrecorded; this way every spawned router lands in ``pods`` and close() kills it.
        start = asyncio.ensure_future(
            RouterProcess.start(
                "--host",
                ip,
                "--port",
                str(self.main_port),
                "--admin-host",
                ip,
                "--admin-port",
                str(self.admin_port),
                "--upstream",
                self.upstream,
                *self.router_args,
            )
        )
        self._starting.add(start)
        router = await asyncio.shield(start)
        process = self.pods[uid] = PodProcess(name=name, uid=uid, ip=ip, router=router)
        pod = self.emulator.get("v1/pods", namespace, name)
        if pod is None or pod["metadata"].get("deletionTimestamp"):  # deleted while starting
            self._sigterm(process)
        process.exit_code = await router.wait(timeout=None)
        async with self.emulator._lock:  # the kubelet confirms the pod is gone once its container exited
            key = self.emulator.key("v1/pods", namespace, name)
            if (
                key in self.emulator.objects
                and not self.emulator.objects[key].deleted
                and self.emulator.objects[key].raw["metadata"].get("uid") == uid
            ):
                self.emulator._hard_delete(key)
            await self.emulator._flush()

    def _may_be_ready(self, pod: dict[str, Any]) -> bool:
        process = self.pods.get(pod["metadata"]["uid"])
        return process is not None and process.router.admin_port is not None and process.exit_code is None

    def _deleted(self, pod: dict[str, Any]) -> None:
        process = self.pods.get(pod["metadata"]["uid"])
        if process is not None:
            self._sigterm(process)

    def _removed(self, pod: dict[str, Any]) -> None:
        """The pod is gone (grace over): SIGKILL a router still running, as the kubelet does."""
        process = self.pods.get(pod["metadata"]["uid"])
        if process is not None and process.router.proc.returncode is None:
            process.router.proc.kill()

    def _sigterm(self, process: PodProcess) -> None:
        if process.router.proc.returncode is None and not process.sigterm_sent:
            process.sigterm_sent = True
            process.router.signal()

    def by_name(self, name: str) -> PodProcess:
        (process,) = [p for p in self.pods.values() if p.name == name]
        return process

    async def close(self) -> None:
        """Unhook first (the Deployment controller keeps creating pods until the test's cluster goes),
        stop the watchers, then kill every router ever spawned (a spawn still under way is awaited:
        it is shielded from the watchers' cancellation, so none goes unrecorded)."""
        self.emulator.on_pod_created = self.emulator.pod_may_be_ready = self.emulator.on_pod_deleted = None
        self.emulator.on_pod_removed = None
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        routers = {id(p.router): p.router for p in self.pods.values()}
        for start in list(self._starting):
            with contextlib.suppress(Exception):
                router = await start
                routers[id(router)] = router
        for router in routers.values():
            await router.kill()


@contextlib.asynccontextmanager
async def fake_model(*args: str) -> AsyncIterator[str]:
    """One ``drain-router-dev fake-model`` on 127.0.0.1; yields its URL."""
    argv = [sys.executable, "-m", "drain_router_dev", "fake-model", "--host", "127.0.0.1", "--port", "0", *args]
    proc = process_.Process("fake-model", argv, log_path("fake-model"))
    proc.start()
    listening: list[dict[str, Any]] = []

    async def listens() -> bool:
        if not proc.alive:
            raise proc.failed("exited before it listened")
        listening.extend(json.loads(line) for line in proc.new_lines())
        return bool(listening)

    try:
        await process_.wait_until(listens, timeout=20, what="the fake model to listen")
        assert listening[0]["event"] == "fake_model.listening", listening[0]
        yield f"http://127.0.0.1:{listening[0]['port']}"
    finally:
        proc.kill()


def pod_names(emulator: ClusterEmulator) -> list[str]:
    return [k[2] for k, o in emulator.objects.items() if k[0] == kmock.resource("v1/pods") and not o.deleted]
