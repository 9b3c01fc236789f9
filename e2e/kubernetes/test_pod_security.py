"""The "restricted" Pod Security Standard on the real control plane: its API server runs the
PodSecurity admission plugin (on by default), which refuses a pod that breaks the profile in a
namespace labelled ``pod-security.kubernetes.io/enforce: restricted``.

The model chart is installed by the real helm into such a namespace, the fake model server behind the
router (engine custom, as every scenario installs it): its ReplicaSet creates its pod, with no
FailedCreate event. The controller's and the activator's pod templates, as the controller chart
installed them, are created (server-side dry run, through the whole admission chain) in the
controller's namespace labelled the same. Each proof has its control: a pod that breaks the profile
is refused there, so the namespace does enforce it.
"""

from __future__ import annotations

from typing import Any

import pytest

from e2e.kubernetes import models
from e2e.kubernetes.conftest import CONTROLLER_NAMESPACE, CONTROLLER_RELEASE
from e2e.kubernetes.kube import MODEL_CHART, ApiError, Helm, Json, Kube

NAMESPACE = "restricted"
ENFORCE = {"pod-security.kubernetes.io/enforce": "restricted", "pod-security.kubernetes.io/enforce-version": "latest"}
VIOLATES = "violates PodSecurity"
CONTROLLER = f"{CONTROLLER_RELEASE}-drain-router-controller"
pytestmark = pytest.mark.timeout(600, func_only=True)


async def enforce_restricted(kube: Kube, namespace: str, *, on: bool = True) -> None:
    """Label the namespace (server-side apply: off removes the labels this manager set)."""
    labels = ENFORCE if on else {}
    body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace, "labels": labels}}
    await kube.apply(body, manager="e2e-pod-security")


async def failed_creates(kube: Kube, namespace: str) -> list[str]:
    """The FailedCreate events' messages in the namespace (a ReplicaSet the admission refused)."""
    _, found = await kube.api.request("GET", f"/api/v1/namespaces/{namespace}/events")
    return [e.get("message", "") for e in found.get("items", []) if e.get("reason") == "FailedCreate"]


def selector(release: str) -> str:
    return f"app.kubernetes.io/instance={release}"


async def test_the_model_chart_is_admitted_in_a_restricted_namespace(kube: Kube, helm: Helm) -> None:
    release = "strict"
    await enforce_restricted(kube, NAMESPACE)
    try:
        # --wait: the Deployment is available, so its pod was admitted and started.
        helm.install(release, MODEL_CHART, NAMESPACE, models.fake_model_values(NAMESPACE, release, replicas=1))
        pods = await kube.list("Pod", NAMESPACE, selector(release))
        assert len(pods) == 1, [p["metadata"]["name"] for p in pods]
        assert not [m for m in await failed_creates(kube, NAMESPACE) if VIOLATES in m and release in m]
    finally:
        helm.uninstall(release, NAMESPACE)


async def test_a_model_pod_that_breaks_the_profile_is_refused_there(kube: Kube, helm: Helm) -> None:
    """The control: the same release with the model server allowed to run as root."""
    release = "rooted"
    await enforce_restricted(kube, NAMESPACE)
    values = models.fake_model_values(NAMESPACE, release, replicas=1)
    values["modelServer"]["securityContext"] = {"runAsNonRoot": False}
    try:
        helm.install(release, MODEL_CHART, NAMESPACE, values, wait=False)

        async def refused() -> list[str]:
            return [m for m in await failed_creates(kube, NAMESPACE) if VIOLATES in m and release in m]

        messages = await kube.wait("the ReplicaSet's FailedCreate: violates PodSecurity", refused, timeout=60)
        assert "runAsNonRoot" in messages[0], messages
        assert not await kube.list("Pod", NAMESPACE, selector(release))
    finally:
        helm.uninstall(release, NAMESPACE)


def _pod(template: Json, namespace: str) -> Json:
    """A pod of the template, labelled so no selector of the chart counts it."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"generateName": "pod-security-", "namespace": namespace, "labels": {"e2e": "pod-security"}},
        "spec": template["spec"],
    }


async def _dry_run(kube: Kube, pod: Json) -> tuple[int, dict[str, Any]]:
    path = f"/api/v1/namespaces/{pod['metadata']['namespace']}/pods?dryRun=All"
    try:
        status, answer = await kube.api.request("POST", path, pod)
    except ApiError as refused:
        status, answer = refused.status, refused.body
    return status, dict(answer)


@pytest.mark.parametrize("deployment", [CONTROLLER, f"{CONTROLLER}-activator"], ids=["controller", "activator"])
async def test_the_controller_charts_pods_are_admitted_as_restricted(kube: Kube, deployment: str) -> None:
    installed = await kube.get("Deployment", CONTROLLER_NAMESPACE, deployment)
    assert installed is not None, deployment
    template = installed["spec"]["template"]
    await enforce_restricted(kube, CONTROLLER_NAMESPACE)
    try:
        status, answer = await _dry_run(kube, _pod(template, CONTROLLER_NAMESPACE))
        assert status == 201, answer.get("message", answer)
        broken = _pod(template, CONTROLLER_NAMESPACE)
        for container in broken["spec"]["containers"]:
            container.setdefault("securityContext", {}).pop("allowPrivilegeEscalation", None)
        status, answer = await _dry_run(kube, broken)
        assert status == 403 and VIOLATES in answer.get("message", ""), (status, answer)
        assert "allowPrivilegeEscalation" in answer["message"]
    finally:
        await enforce_restricted(kube, CONTROLLER_NAMESPACE, on=False)
