"""A pod's containers as the node agent runs them: each one a process group of its own, whose leader
the pod's status reports as ``containerID: process://<pid>``. Signalling that group is what happens
to a container's processes on a real node when they hang (SIGSTOP) or are killed (SIGKILL)."""

from __future__ import annotations

from drain_router_dev.kube.api import Json


def container_pid(pod: Json, container: str) -> int:
    """The process group of ``container``'s running process."""
    for status in pod.get("status", {}).get("containerStatuses", []):
        if status["name"] == container and status.get("containerID", "").startswith("process://"):
            return int(status["containerID"].removeprefix("process://"))
    raise AssertionError(f"no running {container} container in pod {pod['metadata']['name']}")


def restarts(pod: Json) -> int:
    """The restarts of every container of the pod, summed."""
    return sum(int(s.get("restartCount", 0)) for s in pod.get("status", {}).get("containerStatuses", []))


__all__ = ["container_pid", "restarts"]
