"""The escape hatches a platform team needs without forking a chart: each value lands where it
should, security context overrides merge over the chart's safe defaults, and the render refuses a
mount of a volume that is not there or a container name the chart already uses. (Every object of
the value sets that use them is validated against the Kubernetes schemas in test_manifests.py.)"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tests.chart import values_sets
from tests.chart.helm import CONTROLLER_CHART, Helm, containers, model_deployment, one

Docs = list[dict[str, Any]]

SET = values_sets.PLATFORM
W = SET["workload"]
CONTROLLER = values_sets.CONTROLLER_EXTRAS


def pod(docs: Docs) -> dict[str, Any]:
    return model_deployment(docs)["spec"]["template"]


def controller_pod(docs: Docs) -> dict[str, Any]:
    return one(docs, "Deployment")["spec"]["template"]


def metrics_service(docs: Docs) -> dict[str, Any]:
    (svc,) = [d for d in docs if d["kind"] == "Service" and d["metadata"]["name"].endswith("-metrics")]
    return svc


#: (value, where it lands in the model chart's render, what must be there)
MODEL_CHART: list[tuple[str, Callable[[Docs], Any], Callable[[Any], bool]]] = [
    (
        "workload.podAnnotations",
        lambda d: pod(d)["metadata"]["annotations"],
        lambda a: a.items() >= W["podAnnotations"].items(),
    ),
    (
        "workload.podLabels",
        lambda d: pod(d)["metadata"]["labels"],
        lambda labels: labels.items() >= W["podLabels"].items(),
    ),
    (
        "workload.priorityClassName",
        lambda d: pod(d)["spec"]["priorityClassName"],
        lambda v: v == W["priorityClassName"],
    ),
    ("workload.nodeSelector", lambda d: pod(d)["spec"]["nodeSelector"], lambda v: v == W["nodeSelector"]),
    ("workload.tolerations", lambda d: pod(d)["spec"]["tolerations"], lambda v: v == W["tolerations"]),
    ("workload.affinity", lambda d: pod(d)["spec"]["affinity"], lambda v: v == W["affinity"]),
    ("workload.initContainers", lambda d: pod(d)["spec"]["initContainers"], lambda v: v == W["initContainers"]),
    ("workload.extraContainers", lambda d: pod(d)["spec"]["containers"][2:], lambda v: v == W["extraContainers"]),
    ("workload.volumes", lambda d: pod(d)["spec"]["volumes"], lambda v: all(x in v for x in W["volumes"])),
    (
        "router.volumeMounts",
        lambda d: containers(d)["router"]["volumeMounts"],
        lambda v: v == SET["router"]["volumeMounts"],
    ),
    (
        "modelServer.volumeMounts",
        lambda d: containers(d)["model-server"]["volumeMounts"],
        lambda v: v[-1:] == SET["modelServer"]["volumeMounts"],
    ),
    (
        "service.annotations",
        lambda d: one(d, "Service")["metadata"]["annotations"],
        lambda v: v == SET["service"]["annotations"],
    ),
    (
        "service.labels",
        lambda d: one(d, "Service")["metadata"]["labels"],
        lambda v: v.items() >= SET["service"]["labels"].items(),
    ),
]


@pytest.mark.parametrize(("value", "locate", "holds"), MODEL_CHART, ids=[v for v, _, _ in MODEL_CHART])
def test_model_chart_value_lands(
    helm: Helm, value: str, locate: Callable[[Docs], Any], holds: Callable[[Any], bool]
) -> None:
    assert holds(locate(helm.template(SET))), value
    plain = helm.template()
    try:
        default = locate(plain)
    except (KeyError, IndexError, ValueError):
        return
    assert not holds(default), f"{value}: the defaults already render it, so the test proves nothing"


def test_security_contexts_merge_over_the_safe_defaults(helm: Helm) -> None:
    docs = helm.template(SET)
    router = containers(docs)["router"]["securityContext"]
    assert router["seLinuxOptions"] == {"level": "s0:c123,c456"}
    assert router["runAsNonRoot"] is True and router["readOnlyRootFilesystem"] is True
    assert router["capabilities"] == {"drop": ["ALL"]} and router["allowPrivilegeEscalation"] is False
    model = containers(docs)["model-server"]["securityContext"]
    assert model["allowPrivilegeEscalation"] is False and model["runAsNonRoot"] is True, "over the preset's"
    assert pod(docs)["spec"]["securityContext"] == {"fsGroup": 2000, "seccompProfile": {"type": "RuntimeDefault"}}
    removed = pod(helm.template({"workload": {"podSecurityContext": {"seccompProfile": None}}}))["spec"]
    assert "securityContext" not in removed, "null removes a default"


def test_extra_containers_come_after_the_router_and_the_model_server(helm: Helm) -> None:
    names = [c["name"] for c in pod(helm.template(SET))["spec"]["containers"]]
    assert names == ["router", "model-server", "log-shipper"]
    model = containers(helm.template(SET))["model-server"]
    assert model["lifecycle"]["preStop"]["httpGet"]["path"] == "/admin/drain-wait", "the hold stays"


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        pytest.param(
            {"workload": {"extraContainers": [{"name": "router", "image": "x"}]}},
            'a container named "router" is already in the pod',
            id="extra-named-router",
        ),
        pytest.param(
            {"workload": {"extraContainers": [{"name": "model-server", "image": "x"}]}},
            'a container named "model-server" is already in the pod',
            id="extra-named-model-server",
        ),
        pytest.param(
            {"workload": {"extraContainers": [{"name": "a", "image": "x"}, {"name": "a", "image": "y"}]}},
            'a container named "a" is already in the pod',
            id="extra-twice",
        ),
        pytest.param(
            {"router": {"volumeMounts": [{"name": "certs", "mountPath": "/certs"}]}},
            'router.volumeMounts mounts volume "certs", which is not in workload.volumes',
            id="router-mount-without-volume",
        ),
        pytest.param(
            {"modelServer": {"volumeMounts": [{"name": "cache", "mountPath": "/cache"}]}},
            'modelServer.volumeMounts mounts volume "cache", which is not in workload.volumes',
            id="model-mount-without-volume",
        ),
    ],
)
def test_model_chart_render_refuses(helm: Helm, values: dict[str, Any], expected: str) -> None:
    assert expected in helm.template_error(values)


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        pytest.param({"workload": {"extraContainers": [{"name": "x"}]}}, "image", id="container-without-image"),
        pytest.param({"router": {"volumeMounts": [{"name": "x"}]}}, "mountPath", id="mount-without-path"),
        pytest.param({"service": {"labels": {"a": 1}}}, "/service/labels/a", id="label-not-a-string"),
        pytest.param({"workload": {"extraContainer": []}}, "extraContainer", id="typo-key"),
        pytest.param({"router": {"securityContext": {"runAsNonRoot": False}}}, "runAsNonRoot", id="root-router"),
    ],
)
def test_model_chart_schema_rejects(helm: Helm, values: dict[str, Any], expected: str) -> None:
    error = helm.template_error(values)
    assert "schema" in error and expected in error


#: (value, where it lands in the controller chart's render, what must be there)
CONTROLLER_CHART_VALUES: list[tuple[str, Callable[[Docs], Any], Callable[[Any], bool]]] = [
    (
        "podLabels",
        lambda d: controller_pod(d)["metadata"]["labels"],
        lambda v: v.items() >= CONTROLLER["podLabels"].items(),
    ),
    (
        "initContainers",
        lambda d: controller_pod(d)["spec"]["initContainers"],
        lambda v: v == CONTROLLER["initContainers"],
    ),
    (
        "extraContainers",
        lambda d: controller_pod(d)["spec"]["containers"][1:],
        lambda v: v == CONTROLLER["extraContainers"],
    ),
    ("volumes", lambda d: controller_pod(d)["spec"]["volumes"], lambda v: v == CONTROLLER["volumes"]),
    (
        "volumeMounts",
        lambda d: controller_pod(d)["spec"]["containers"][0]["volumeMounts"],
        lambda v: v == CONTROLLER["volumeMounts"],
    ),
    ("tolerations", lambda d: controller_pod(d)["spec"]["tolerations"], lambda v: v == CONTROLLER["tolerations"]),
    ("nodeSelector", lambda d: controller_pod(d)["spec"]["nodeSelector"], lambda v: v == CONTROLLER["nodeSelector"]),
    (
        "priorityClassName",
        lambda d: controller_pod(d)["spec"]["priorityClassName"],
        lambda v: v == CONTROLLER["priorityClassName"],
    ),
    (
        "monitoring.serviceMonitor.serviceLabels",
        lambda d: metrics_service(d)["metadata"]["labels"],
        lambda v: v.items() >= {"exposure": "internal"}.items(),
    ),
    (
        "monitoring.serviceMonitor.serviceAnnotations",
        lambda d: metrics_service(d)["metadata"]["annotations"],
        lambda v: v == {"example.com/scrape": "true"},
    ),
]


@pytest.mark.parametrize(
    ("value", "locate", "holds"), CONTROLLER_CHART_VALUES, ids=[v for v, _, _ in CONTROLLER_CHART_VALUES]
)
def test_controller_chart_value_lands(
    helm: Helm, value: str, locate: Callable[[Docs], Any], holds: Callable[[Any], bool]
) -> None:
    assert holds(locate(helm.template(CONTROLLER, chart=CONTROLLER_CHART))), value
    plain = helm.template({"monitoring": {"serviceMonitor": {"enabled": True}}}, chart=CONTROLLER_CHART)
    try:
        default = locate(plain)
    except (KeyError, IndexError, ValueError):
        return
    assert not holds(default), f"{value}: the defaults already render it, so the test proves nothing"


def test_controller_security_context_merges_over_the_defaults(helm: Helm) -> None:
    spec = controller_pod(helm.template(CONTROLLER, chart=CONTROLLER_CHART))["spec"]
    assert spec["securityContext"]["fsGroup"] == 10001
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is True


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        pytest.param(
            {"extraContainers": [{"name": "controller", "image": "x"}]},
            "the name controller is the controller's own container",
            id="extra-named-controller",
        ),
        pytest.param(
            {"volumeMounts": [{"name": "ca", "mountPath": "/ca"}]},
            'volumeMounts mounts volume "ca", which is not in volumes',
            id="mount-without-volume",
        ),
    ],
)
def test_controller_chart_render_refuses(helm: Helm, values: dict[str, Any], expected: str) -> None:
    assert expected in helm.template_error(values, chart=CONTROLLER_CHART)
