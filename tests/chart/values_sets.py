"""Value sets the chart is rendered with: the defaults and a few an operator would really use."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

VALUES = Path(__file__).resolve().parents[2] / "charts" / "drain-router" / "values.yaml"

FULL: dict[str, Any] = {
    # Everything on: the route, the ModelService with recycling and lifecycle rules.
    "terminationGraceSecs": 600,
    "shutdownDrainSecs": 45,
    "httpRoute": {
        "enabled": True,
        "parentRefs": [{"name": "inference", "namespace": "gateways"}],
        "hostnames": ["llm.example.com"],
        "timeouts": {"request": "0s", "backendRequest": "0s"},
    },
    "modelService": {
        "enabled": True,
        "annotations": {"drainrouter.dev/route-settle": "90s"},
        "deletion": {"maxWait": "2h", "routeSettle": "60s", "forceDeleteAfter": "30m"},
        "recycling": {"enabled": True, "maxPodLifetimeSeconds": 43200, "maxPodLifetimeIdleTimeoutSeconds": 3600},
        "lifecycleRules": [
            {"policy": "ScaleToZero", "condition": {"idleSeconds": 1800}},
            {"policy": "DeleteSelf", "condition": {"idleSeconds": 86400}},
        ],
    },
    "workload": {
        "replicas": 3,
        "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}},
        "volumes": [{"name": "cache", "persistentVolumeClaim": {"claimName": "hf-cache"}}],
    },
    "modelServer": {
        "env": [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}}],
        "volumeMounts": [{"name": "cache", "mountPath": "/root/.cache/huggingface"}],
    },
    "router": {"accessLog": True, "extraArgs": ["--upstream-max-connections", "512"]},
}

OTHER_SERVER: dict[str, Any] = {
    # Another model server (SGLang) on other ports, a long grace, probes not declared to the router.
    "terminationGraceSecs": 1900,
    "shutdownDrainSecs": 1800,
    "router": {
        "port": 8081,
        "adminPort": 9191,
        "upstreamHealthPath": "",
        "readinessProbe": {"periodSeconds": 2, "failureThreshold": 5, "declareToRouter": False},
    },
    "modelServer": {
        "name": "sglang",
        "image": {"repository": "lmsysorg/sglang", "tag": "v0.4.10"},
        "port": 30000,
        "command": ["python3", "-m", "sglang.launch_server"],
        "args": ["--model-path", "Qwen/Qwen2.5-0.5B-Instruct", "--host", "127.0.0.1", "--port", "30000"],
        "shmSize": "",
    },
    "pdb": {"maxUnavailable": None, "minAvailable": "50%"},
    "controller": {"allNamespaces": True, "image": {"repository": "registry.example.com/drain-router", "tag": "0.1.0"}},
    "image": {"repository": "registry.example.com/drain-router", "digest": "sha256:" + "0" * 64},
}

CONTROLLER_ONLY: dict[str, Any] = {"workload": {"enabled": False}, "controller": {"watchNamespaces": ["a", "b"]}}

NO_CONTROLLER: dict[str, Any] = {"controller": {"enabled": False}}

#: Sets that render a model server Deployment.
WITH_WORKLOAD = [
    pytest.param({}, id="defaults"),
    pytest.param(FULL, id="full"),
    pytest.param(OTHER_SERVER, id="other-server"),
    pytest.param(NO_CONTROLLER, id="no-controller"),
]
ALL = [*WITH_WORKLOAD, pytest.param(CONTROLLER_ONLY, id="controller-only")]


def merged(overrides: dict[str, Any]) -> dict[str, Any]:
    """The chart's defaults with ``overrides`` merged in, the way helm merges maps."""
    base = yaml.safe_load(VALUES.read_text())

    def merge(into: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
        out = dict(into)
        for key, value in extra.items():
            if isinstance(value, dict) and isinstance(out.get(key), dict):
                out[key] = merge(out[key], value)
            elif value is None:
                out.pop(key, None)  # helm: null deletes a default
            else:
                out[key] = value
        return out

    return merge(base, overrides)
