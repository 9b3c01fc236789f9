"""The lifecycle rule DeleteSelf on the real control plane: a model service idle past its threshold is
deleted by the controller itself (its only use of ``delete`` on ModelServices), and the staged
teardown its finalizer runs removes the route and the workload; the real garbage collector removes
the ReplicaSet and pods."""

from __future__ import annotations

import pytest

from e2e.kubernetes import models
from e2e.kubernetes.audit import AuditLog
from e2e.kubernetes.conftest import CONTROLLER_USER
from e2e.kubernetes.kube import MODEL_CHART, Helm, Kube

NAMESPACE = "team-b"
RELEASE = "kselfdel"
IDLE_SECS = 3
pytestmark = pytest.mark.timeout(600, func_only=True)


async def test_an_idle_service_deletes_itself_through_its_teardown(kube: Kube, helm: Helm) -> None:
    values = models.fake_model_values(
        NAMESPACE, RELEASE, model_service=True,
        extra={"modelService": {
            "enabled": True,
            "lifecycleRules": [{"policy": "DeleteSelf", "condition": {"idleSeconds": IDLE_SECS}}],
            "deletion": {"routeSettle": "0s", "maxWait": "5m"},
        }},
    )  # fmt: skip
    audit = AuditLog(kube.cluster.audit_log)
    helm.install(RELEASE, MODEL_CHART, NAMESPACE, values)
    name = f"{RELEASE}-drain-router"
    try:
        # Nobody sends it anything: idle from the start, deleted past the threshold, torn down.
        await kube.wait_gone("ModelService", NAMESPACE, name, timeout=180)
        await kube.wait_gone("Deployment", NAMESPACE, name, timeout=60)
        await kube.wait_gone("HTTPRoute", NAMESPACE, name, timeout=10)

        async def no_pods() -> bool:
            return not await kube.list("Pod", NAMESPACE, f"app.kubernetes.io/instance={RELEASE}")

        await kube.wait("the release's pods gone", no_pods, timeout=120)
        deletes = [
            c for c in audit.writes(CONTROLLER_USER, NAMESPACE) if c.verb == "delete" and c.resource == "modelservices"
        ]
        assert [c.name for c in deletes] == [name], deletes
    finally:
        helm.uninstall(RELEASE, NAMESPACE)
