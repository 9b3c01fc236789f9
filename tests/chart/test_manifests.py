"""helm lint, offline schema validation of every rendered object, the CRD, the route and the
ModelService the chart renders."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from tests.chart import crds, values_sets
from tests.chart.helm import (
    CHART,
    CONTROLLER_CHART,
    NAMESPACE,
    RELEASE,
    VALIDATE_VERSIONS,
    Helm,
    find,
    model_deployment,
    one,
)

#: CRD-defined kinds that kubernetes-validate has no schema for: validated against their CRDs' schemas
#: instead (shipped as test data, see tests/chart/crds.py).
CRD_KINDS = set(crds.CRD_FILES)
FULLNAME = f"{RELEASE}-drain-router"

RENDERS = [
    *[pytest.param(CHART, p.values[0], id=p.id) for p in values_sets.ALL],
    *[pytest.param(CONTROLLER_CHART, p.values[0], id=p.id) for p in values_sets.CONTROLLER_SETS],
]


@pytest.mark.parametrize(("chart", "values"), RENDERS)
def test_helm_lint_strict(helm: Helm, tmp_path: Any, chart: Path, values: dict[str, Any]) -> None:
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    done = helm.run("lint", "--strict", str(chart), "-f", str(path), "--namespace", NAMESPACE)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 chart(s) failed" in done.stdout


@pytest.mark.parametrize("kube_version", VALIDATE_VERSIONS)
@pytest.mark.parametrize(("chart", "values"), RENDERS)
def test_every_object_validates_against_the_kubernetes_schemas(
    helm: Helm, chart: Path, values: dict[str, Any], kube_version: str
) -> None:
    docs = helm.template(values, include_crds=True, chart=chart)
    custom = 0
    for doc in docs:
        if (doc["apiVersion"], doc["kind"]) in CRD_KINDS:
            custom += 1
            crds.validate(doc)
            continue
        kubernetes_validate.validate(doc, kube_version, strict=True)
    assert len(docs) > custom


def test_custom_resources_of_every_kind_are_rendered_and_validated(helm: Helm) -> None:
    """The value sets above do render every CRD-backed kind (else their validation proves nothing)."""
    kinds = {
        (d["apiVersion"], d["kind"])
        for chart, values in [
            (CHART, values_sets.FULL),
            (CHART, values_sets.INFERENCE_POOL),
            (CHART, values_sets.KEDA),
            (CHART, values_sets.GRPC_VLLM),
            (CONTROLLER_CHART, values_sets.CONTROLLER_CLUSTER),
            (CONTROLLER_CHART, values_sets.CONTROLLER_ACTIVATOR),
        ]
        for d in helm.template(values, chart=chart)
    }
    assert set(crds.CRD_FILES) <= kinds


def test_crd_schema_validation_catches_a_wrong_field(helm: Helm) -> None:
    pool = one(helm.template(values_sets.INFERENCE_POOL), "InferencePool")
    crds.validate(pool)
    pool["spec"]["targetPort"] = pool["spec"].pop("targetPorts")
    with pytest.raises(jsonschema.ValidationError):
        crds.validate(pool)
    monitor = one(helm.template(values_sets.FULL), "PodMonitor")
    monitor["spec"]["podMetricsEndpoints"][0]["interval"] = "15 seconds"
    with pytest.raises(jsonschema.ValidationError):
        crds.validate(monitor)


def test_crd_comes_from_the_controller_charts_crds_dir_unchanged(helm: Helm) -> None:
    crd_file = yaml.safe_load((CONTROLLER_CHART / "crds" / "modelservice.yaml").read_text())
    assert one(helm.template(include_crds=True, chart=CONTROLLER_CHART), "CustomResourceDefinition") == crd_file
    assert not find(helm.template(chart=CONTROLLER_CHART), "CustomResourceDefinition"), "only through crds/"
    assert not find(helm.template(include_crds=True), "CustomResourceDefinition"), "the model chart ships none"


def crd_schema() -> dict[str, Any]:
    return crds.crd_schema("drainrouter.dev/v1alpha1", "ModelService")


def test_model_service_matches_the_crd_and_points_at_this_release(helm: Helm) -> None:
    docs = helm.template(values_sets.FULL)
    ms = one(docs, "ModelService")
    jsonschema.validate(ms, crd_schema())
    spec = ms["spec"]
    assert spec["workload"] == [
        {"apiVersion": "apps/v1", "kind": "Deployment", "name": FULLNAME},
        {"apiVersion": "v1", "kind": "Service", "name": FULLNAME},
    ]
    assert spec["route"] == {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute", "name": FULLNAME}
    one(docs, "Deployment", FULLNAME), one(docs, "Service", FULLNAME), one(docs, "HTTPRoute", FULLNAME)
    assert spec["router"] == {"adminPort": 9091, "port": 8080}
    assert spec["deletion"] == {"maxWait": "2h", "routeSettle": "60s", "forceDeleteAfter": "30m"}
    assert spec["recycling"] == {
        "maxPodLifetimeSeconds": 43200,
        "waitForIdle": True,
        "maxPodLifetimeIdleTimeoutSeconds": 3600,
    }
    assert spec["lifecycle"]["rules"][0] == {"policy": "ScaleToZero", "condition": {"idleSeconds": 1800}}
    # The podSelector is the Deployment's: its pods, never the controller's.
    assert spec["podSelector"] == {"matchLabels": model_deployment(docs)["spec"]["selector"]["matchLabels"]}
    controller = one(helm.template(chart=CONTROLLER_CHART), "Deployment")
    assert (
        not spec["podSelector"]["matchLabels"].items() <= controller["spec"]["template"]["metadata"]["labels"].items()
    )


def test_model_service_defaults_match_the_crd(helm: Helm) -> None:
    ms = one(helm.template({"modelService": {"enabled": True}}), "ModelService")
    jsonschema.validate(ms, crd_schema())
    assert "route" not in ms["spec"] and "recycling" not in ms["spec"] and "lifecycle" not in ms["spec"]
    assert ms["spec"]["deletion"]["forceDeleteAfter"] is None


def test_model_service_workload_is_labelled_and_kept_by_helm_uninstall(helm: Helm) -> None:
    """helm uninstall deletes only the ModelService; the controller removes the rest in order."""
    docs = helm.template(values_sets.FULL)
    ms = one(docs, "ModelService")
    name = ms["metadata"]["name"]
    for kind in ("Deployment", "Service", "HTTPRoute"):
        obj = one(docs, kind, FULLNAME)
        assert obj["metadata"]["labels"]["drainrouter.dev/service"] == name
        assert obj["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    # The label is the controller's consent: every object the ModelService names carries it, or the
    # controller leaves it alone at teardown.
    named = [*ms["spec"]["workload"], *([ms["spec"]["route"]] if ms["spec"].get("route") else [])]
    assert named
    for ref in named:
        obj = one(docs, ref["kind"], ref["name"])
        assert obj["apiVersion"] == ref["apiVersion"]
        assert obj["metadata"]["labels"]["drainrouter.dev/service"] == name, ref
    plain = helm.template()
    for kind in ("Deployment", "Service"):
        meta = one(plain, kind, FULLNAME)["metadata"]
        assert "drainrouter.dev/service" not in meta["labels"]
        assert "helm.sh/resource-policy" not in meta.get("annotations", {})


def test_http_route_targets_the_service(helm: Helm) -> None:
    docs = helm.template(values_sets.FULL)
    route = one(docs, "HTTPRoute")
    assert route["spec"]["parentRefs"] == [{"name": "inference", "namespace": "gateways"}]
    (rule,) = route["spec"]["rules"]
    assert rule["backendRefs"] == [{"name": FULLNAME, "port": one(docs, "Service")["spec"]["ports"][0]["port"]}]
    assert rule["timeouts"] == {"request": "0s", "backendRequest": "0s"}
    assert not find(helm.template(), "HTTPRoute"), "off by default"


def test_notes_warn_about_a_drain_inside_the_probe_window(helm: Helm) -> None:
    """With the probe declared to the router such a drain fails the render (test_strict_agreement);
    undeclared, the install notes still warn."""
    done = helm.run(
        "install",
        RELEASE,
        str(CHART),
        "--namespace",
        NAMESPACE,
        "--dry-run=client",
        "--set",
        "shutdownDrainSecs=10",
        "--set",
        "router.readinessProbe.declareToRouter=false",
        "--set",
        "modelService.enabled=true",
    )
    assert done.returncode == 0, done.stderr
    notes = done.stdout.split("NOTES:", 1)[1]
    assert "terminationGracePeriodSeconds = --termination-grace-secs = 180 s" in notes
    assert "not above the readiness probe window" in notes
    assert "needs the drain-router-controller chart" in notes
    quiet = helm.run("install", RELEASE, str(CHART), "--namespace", NAMESPACE, "--dry-run=client")
    assert "WARNING" not in quiet.stdout.split("NOTES:", 1)[1]
