"""helm lint, offline schema validation of every rendered object, the CRD, the route and the
ModelService the chart renders."""

from __future__ import annotations

import copy
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from tests.chart import values_sets
from tests.chart.helm import CHART, KUBE_VERSION, NAMESPACE, RELEASE, Helm, find, model_deployment, one

#: CRD-defined kinds that kubernetes-validate has no schema for; checked by the tests below instead.
NOT_IN_KUBERNETES_SCHEMAS = {
    ("gateway.networking.k8s.io/v1", "HTTPRoute"),
    ("drainrouter.dev/v1alpha1", "ModelService"),
}
FULLNAME = f"{RELEASE}-drain-router"


@pytest.mark.parametrize("values", [pytest.param({}, id="defaults"), pytest.param(values_sets.FULL, id="full")])
def test_helm_lint_strict(helm: Helm, tmp_path: Any, values: dict[str, Any]) -> None:
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    done = helm.run("lint", "--strict", str(CHART), "-f", str(path), "--namespace", NAMESPACE)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 chart(s) failed" in done.stdout


@pytest.mark.parametrize("values", values_sets.ALL)
def test_every_object_validates_against_the_kubernetes_schemas(helm: Helm, values: dict[str, Any]) -> None:
    docs = helm.template(values, include_crds=True)
    skipped = 0
    for doc in docs:
        if (doc["apiVersion"], doc["kind"]) in NOT_IN_KUBERNETES_SCHEMAS:
            skipped += 1
            continue
        kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)
    assert skipped == len([d for d in docs if (d["apiVersion"], d["kind"]) in NOT_IN_KUBERNETES_SCHEMAS])
    assert len(docs) > skipped


def test_crd_comes_from_crds_dir_unchanged(helm: Helm) -> None:
    crd_file = yaml.safe_load((CHART / "crds" / "modelservice.yaml").read_text())
    assert one(helm.template(include_crds=True), "CustomResourceDefinition") == crd_file
    assert not find(helm.template(), "CustomResourceDefinition"), "CRDs only through Helm's crds/ mechanism"


def _openapi_to_jsonschema(node: Any) -> Any:
    """OpenAPI v3 ``nullable: true`` -> JSON Schema ``null`` allowed; Kubernetes extensions dropped."""
    if isinstance(node, list):
        return [_openapi_to_jsonschema(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: _openapi_to_jsonschema(v) for k, v in node.items() if not k.startswith("x-kubernetes-")}
    if out.pop("nullable", False):
        out = {"anyOf": [{"type": "null"}, out]}
    return out


def crd_schema() -> dict[str, Any]:
    crd = yaml.safe_load((CHART / "crds" / "modelservice.yaml").read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1alpha1"]
    schema = _openapi_to_jsonschema(copy.deepcopy(version["schema"]["openAPIV3Schema"]))
    schema["properties"]["spec"]["additionalProperties"] = False  # structural schemas prune unknown fields
    return schema


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
    assert spec["router"] == {"adminPort": 9091}
    assert spec["deletion"] == {"maxWait": "2h", "routeSettle": "60s", "forceDeleteAfter": "30m"}
    assert spec["recycling"] == {
        "maxPodLifetimeSeconds": 43200,
        "waitForIdle": True,
        "maxPodLifetimeIdleTimeoutSeconds": 3600,
    }
    assert spec["lifecycle"]["rules"][0] == {"policy": "ScaleToZero", "condition": {"idleSeconds": 1800}}
    # The podSelector is the Deployment's: its pods, never the controller's.
    assert spec["podSelector"] == {"matchLabels": model_deployment(docs)["spec"]["selector"]["matchLabels"]}
    controller_labels = one(docs, "Deployment", f"{FULLNAME}-controller")["spec"]["template"]["metadata"]["labels"]
    assert not spec["podSelector"]["matchLabels"].items() <= controller_labels.items()


def test_model_service_defaults_match_the_crd(helm: Helm) -> None:
    ms = one(helm.template({"modelService": {"enabled": True}}), "ModelService")
    jsonschema.validate(ms, crd_schema())
    assert "route" not in ms["spec"] and "recycling" not in ms["spec"] and "lifecycle" not in ms["spec"]
    assert ms["spec"]["deletion"]["forceDeleteAfter"] is None


def test_model_service_workload_is_labelled_and_kept_by_helm_uninstall(helm: Helm) -> None:
    """helm uninstall deletes only the ModelService; the controller removes the rest in order."""
    docs = helm.template(values_sets.FULL)
    name = one(docs, "ModelService")["metadata"]["name"]
    for kind in ("Deployment", "Service", "HTTPRoute"):
        obj = one(docs, kind, FULLNAME)
        assert obj["metadata"]["labels"]["drainrouter.dev/service"] == name
        assert obj["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
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


def test_controller_only_release(helm: Helm) -> None:
    docs = helm.template(values_sets.CONTROLLER_ONLY)
    assert [d["metadata"]["name"] for d in find(docs, "Deployment")] == [f"{FULLNAME}-controller"]
    assert not find(docs, "Service") and not find(docs, "PodDisruptionBudget")


def test_notes_warn_about_a_drain_inside_the_probe_window_and_a_self_removing_controller(helm: Helm) -> None:
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
        "modelService.enabled=true",
    )
    assert done.returncode == 0, done.stderr
    notes = done.stdout.split("NOTES:", 1)[1]
    assert "terminationGracePeriodSeconds = --termination-grace-secs = 180 s" in notes
    assert "not above the readiness probe window" in notes
    assert "Run the\n  controller in its own release" in notes
    quiet = helm.run("install", RELEASE, str(CHART), "--namespace", NAMESPACE, "--dry-run=client")
    assert "WARNING" not in quiet.stdout.split("NOTES:", 1)[1]
