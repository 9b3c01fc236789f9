"""CRD schemas as JSON Schemas, to validate the custom resources the charts render offline.

The CRDs of the kinds the charts render but do not own are shipped as test data in ``crds/``, copied
unchanged from their projects' releases:

- ``inference.networking.k8s.io_inferencepools.yaml``: gateway-api-inference-extension v1.6.0
  (``config/crd/bases/``), InferencePool ``inference.networking.k8s.io/v1``;
- ``monitoring.coreos.com_{podmonitors,servicemonitors}.yaml``: prometheus-operator v0.93.0
  (``example/prometheus-operator-crd/``), PodMonitor and ServiceMonitor ``monitoring.coreos.com/v1``;
- ``gateway.networking.k8s.io_{httproutes,grpcroutes}.yaml``: Gateway API v1.6.1, standard channel
  (``config/crd/standard/``), HTTPRoute and GRPCRoute ``gateway.networking.k8s.io/v1``;
- ``gateway.networking.k8s.io_referencegrants.yaml``: Gateway API v1.2.1, standard channel,
  ReferenceGrant ``gateway.networking.k8s.io/v1beta1``: no chart renders one; installed with the rest
  on the e2e control plane, whose gateway honours them as a Gateway API implementation does;
- ``keda.sh_scaledobjects.yaml``: KEDA v2.20.2 (``config/crd/bases/``), ScaledObject
  ``keda.sh/v1alpha1``.

The ModelService CRD is the controller chart's own (``charts/drain-router-controller/crds/``).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from tests.chart.helm import CONTROLLER_CHART

DATA = Path(__file__).resolve().parent / "crds"
CRD_FILES = {
    ("inference.networking.k8s.io/v1", "InferencePool"): DATA / "inference.networking.k8s.io_inferencepools.yaml",
    ("monitoring.coreos.com/v1", "PodMonitor"): DATA / "monitoring.coreos.com_podmonitors.yaml",
    ("monitoring.coreos.com/v1", "ServiceMonitor"): DATA / "monitoring.coreos.com_servicemonitors.yaml",
    ("gateway.networking.k8s.io/v1", "HTTPRoute"): DATA / "gateway.networking.k8s.io_httproutes.yaml",
    ("gateway.networking.k8s.io/v1", "GRPCRoute"): DATA / "gateway.networking.k8s.io_grpcroutes.yaml",
    ("keda.sh/v1alpha1", "ScaledObject"): DATA / "keda.sh_scaledobjects.yaml",
    ("drainrouter.dev/v1alpha1", "ModelService"): CONTROLLER_CHART / "crds" / "modelservice.yaml",
}


def openapi_to_jsonschema(node: Any, *, closed: bool = True) -> Any:
    """OpenAPI v3 ``nullable: true`` -> JSON Schema ``null`` allowed; Kubernetes extensions dropped.
    With ``closed``, an object schema that lists its properties refuses any other: the API server
    would silently prune an unknown field (a typo in a template), which is a bug here."""
    if isinstance(node, list):
        return [openapi_to_jsonschema(n, closed=closed) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: openapi_to_jsonschema(v, closed=closed) for k, v in node.items() if not k.startswith("x-kubernetes-")}
    if closed and "properties" in out and "additionalProperties" not in out:
        out["additionalProperties"] = False
    if out.pop("nullable", False):
        out = {"anyOf": [{"type": "null"}, out]}
    return out


def crd_schema(api_version: str, kind: str) -> dict[str, Any]:
    crd = yaml.safe_load(CRD_FILES[(api_version, kind)].read_text())
    group, version = api_version.split("/")
    assert crd["spec"]["group"] == group and crd["spec"]["names"]["kind"] == kind
    (served,) = [v for v in crd["spec"]["versions"] if v["name"] == version and v.get("served", True)]
    schema = copy.deepcopy(served["schema"]["openAPIV3Schema"])
    # apiVersion, kind and metadata are the API server's: a CRD need not list them.
    schema.setdefault("properties", {}).update(
        {"apiVersion": {"type": "string"}, "kind": {"type": "string"}, "metadata": {"type": "object"}}
    )
    return openapi_to_jsonschema(schema)


def validate(doc: dict[str, Any]) -> None:
    """Validate a rendered custom resource against its CRD's schema (jsonschema.ValidationError)."""
    jsonschema.validate(doc, crd_schema(doc["apiVersion"], doc["kind"]))
