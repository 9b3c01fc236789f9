"""Value sets the chart is rendered with: the defaults and a few an operator would really use."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

VALUES = Path(__file__).resolve().parents[2] / "charts" / "drain-router" / "values.yaml"
CONTROLLER_VALUES = Path(__file__).resolve().parents[2] / "charts" / "drain-router-controller" / "values.yaml"

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
        "progressDeadlineSeconds": 5400,
        "serviceAccountName": "llama-weights",
        "automountServiceAccountToken": True,
        "runtimeClassName": "nvidia",
        "initContainers": [
            {
                "name": "fetch-weights",
                "image": "registry.example.com/fetch:1",
                "args": ["s3://weights/llama", "/models"],
                "volumeMounts": [{"name": "cache", "mountPath": "/models"}],
            }
        ],
        "volumes": [{"name": "cache", "persistentVolumeClaim": {"claimName": "hf-cache"}}],
    },
    "modelServer": {
        "model": "/models/llama",
        "args": ["--max-model-len", "8192"],
        "env": [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}}],
        "volumeMounts": [{"name": "cache", "mountPath": "/home/model-server/.cache/huggingface"}],
    },
    "router": {
        "accessLog": True,
        "websocketCloseAt": "closing",
        "extraArgs": ["--upstream-max-connections", "512"],
    },
    "monitoring": {"podMonitor": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}}},
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
        "engine": "sglang",
        "name": "sglang",
        "image": {"tag": "v0.4.10"},
        "shmSize": "",
    },
    "pdb": {"maxUnavailable": None, "minAvailable": "50%"},
    "networkPolicy": {"controller": {"namespace": "drain-router-system"}},
    "image": {"repository": "registry.example.com/drain-router", "digest": "sha256:" + "0" * 64},
}

CUSTOM_SERVER: dict[str, Any] = {
    # An engine without a preset: the image, the full argument list and the port are the user's.
    "modelServer": {
        "engine": "custom",
        "image": {"repository": "registry.example.com/my-server", "tag": "2.1"},
        "port": 7000,
        "command": ["my-server"],
        "args": ["--bind", "127.0.0.1:7000"],
        "startupProbe": {"exec": {"command": ["my-server", "health"]}, "failureThreshold": 90, "periodSeconds": 10},
    },
    "router": {"upstreamHealthPath": "/ping"},
    "networkPolicy": {"controller": {"enabled": False}},
}

INFERENCE_POOL: dict[str, Any] = {
    # llm-d style: the route sends to an InferencePool whose endpoint picker chooses the pod.
    "httpRoute": {"enabled": True, "backend": "InferencePool", "parentRefs": [{"name": "inference"}]},
    "inferencePool": {"enabled": True, "endpointPicker": {"name": "llama-epp"}},
    "modelService": {"enabled": True},
    "modelServer": {"engine": "tgi"},
}

POOL_WITHOUT_ROUTE: dict[str, Any] = {
    # The pool alone (a shared HTTPRoute elsewhere points at it): the pool is the ModelService's route.
    "inferencePool": {"enabled": True, "endpointPicker": {"name": "llama-epp", "failureMode": "FailOpen"}},
    "modelService": {"enabled": True},
    "modelServer": {"engine": "llamacpp", "model": "Qwen/Qwen2.5-0.5B-Instruct-GGUF"},
}

PLATFORM: dict[str, Any] = {
    # A platform team's release: the HorizontalPodAutoscaler, and every escape hatch of the pod.
    "autoscaling": {"enabled": True, "minReplicas": 2, "maxReplicas": 8, "targetInflightPerPod": 24},
    "monitoring": {"podMonitor": {"enabled": True}},
    "workload": {
        "podAnnotations": {"example.com/cost-center": "llm"},
        "podLabels": {"team": "inference"},
        "podSecurityContext": {"fsGroup": 2000},
        "priorityClassName": "serving",
        "nodeSelector": {"cloud.example.com/gpu": "h100"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["a"]}
                            ]
                        }
                    ]
                }
            }
        },
        "initContainers": [{"name": "warm-cache", "image": "registry.example.com/warm:1"}],
        "extraContainers": [
            {
                "name": "log-shipper",
                "image": "registry.example.com/shipper:2",
                "volumeMounts": [{"name": "spool", "mountPath": "/spool"}],
            }
        ],
        "volumes": [
            {"name": "ca", "configMap": {"name": "corporate-ca"}},
            {"name": "spool", "emptyDir": {}},
        ],
    },
    "router": {
        "volumeMounts": [{"name": "ca", "mountPath": "/etc/ssl/corporate", "readOnly": True}],
        "securityContext": {"seLinuxOptions": {"level": "s0:c123,c456"}},
    },
    "modelServer": {
        "volumeMounts": [{"name": "spool", "mountPath": "/var/log/model"}],
        "securityContext": {"allowPrivilegeEscalation": False},
    },
    "service": {"annotations": {"example.com/lb": "internal"}, "labels": {"exposure": "internal"}},
}

KEDA: dict[str, Any] = {
    # The same autoscaling through KEDA, which queries Prometheus itself.
    "autoscaling": {
        "enabled": True,
        "keda": {"enabled": True, "serverAddress": "http://prometheus-operated.monitoring.svc:9090"},
    },
}

GRPC_VLLM: dict[str, Any] = {
    # vLLM in gRPC mode behind the router's gRPC listener, a GRPCRoute, the readiness probe on the
    # router's grpc.health.v1, and the ModelService tearing the GRPCRoute down first.
    "grpc": {"enabled": True},
    "router": {"readinessProbe": {"protocol": "grpc"}},
    "grpcRoute": {
        "enabled": True,
        "parentRefs": [{"name": "inference", "namespace": "gateways"}],
        "hostnames": ["grpc.example.com"],
        "methods": [{"service": "vllm.grpc.engine.VllmEngine"}],
    },
    "modelService": {"enabled": True},
    "modelServer": {"image": {"repository": "registry.example.com/vllm-grpc", "tag": "v0.19.0"}},
}

GRPC_POOL: dict[str, Any] = {
    # SGLang in gRPC mode behind an InferencePool (h2c) that a GRPCRoute sends to, beside the
    # Service's HTTP port on other router ports.
    "grpc": {"enabled": True, "port": 50051, "servicePort": 50051},
    "router": {"port": 8090, "adminPort": 9191},
    "modelServer": {"engine": "sglang", "image": {"tag": "v0.5.5"}},
    "inferencePool": {"enabled": True, "endpointPicker": {"name": "llama-epp"}},
    "grpcRoute": {
        "enabled": True,
        "backend": "InferencePool",
        "parentRefs": [{"name": "inference"}],
        "methods": [
            {"service": "sglang.grpc.scheduler.SglangScheduler", "method": "Generate"},
            {"type": "RegularExpression", "service": "sglang\\.grpc\\..*"},
        ],
    },
    "modelService": {"enabled": True},
}

GRPC_TRITON: dict[str, Any] = {
    # Triton as engine custom: HTTP on 8000 and gRPC on 8001 side by side, both behind the router.
    "grpc": {"enabled": True, "modelServerPort": 8001},
    "modelServer": {
        "engine": "custom",
        "image": {"repository": "nvcr.io/nvidia/tritonserver", "tag": "25.01-vllm-python-py3"},
        "port": 8000,
        "command": ["tritonserver"],
        "args": [
            "--model-repository=/models",
            "--http-address=127.0.0.1",
            "--http-port=8000",
            "--grpc-address=127.0.0.1",
            "--grpc-port=8001",
            "--allow-metrics=false",
            "--exit-timeout-secs=150",
        ],
        "securityContext": {"runAsUser": 1000},
    },
    "router": {"upstreamHealthPath": "/v2/health/ready"},
    "httpRoute": {"enabled": True, "parentRefs": [{"name": "inference"}]},
    "grpcRoute": {"enabled": True, "parentRefs": [{"name": "inference"}]},
    "networkPolicy": {"trafficFrom": [{"podSelector": {"matchLabels": {"app": "gateway"}}}]},
}

OVERLOAD: dict[str, Any] = {
    # vLLM with its batch limit stated once (--max-num-seqs), which the router's admission control
    # takes; the HorizontalPodAutoscaler counts the queued requests with the ones in flight.
    "modelServer": {"args": ["--max-num-seqs", "128"]},
    "router": {"admission": {"queueSize": 64}},
    "autoscaling": {"enabled": True, "includeQueued": True, "targetInflightPerPod": 96},
    "monitoring": {"podMonitor": {"enabled": True}},
}

FRONT: dict[str, Any] = {
    # The front between the route and the pods (SGLang: the preset's continuation is chat), its own
    # admission gate, both ways in restricted to the gateways' namespace, scraped, traced; the
    # ModelService sleeps the model and the front asks for the wakes.
    "front": {
        "enabled": True,
        "replicas": 3,
        "admission": {"maxConcurrentRequests": 512, "queueSize": 1024, "queueTimeoutSecs": 20},
        "podAnnotations": {"example.com/cost-center": "llm"},
        "nodeSelector": {"node-role.example.com/edge": "true"},
    },
    "modelService": {
        "enabled": True,
        "lifecycleRules": [{"policy": "ScaleToZero", "condition": {"idleSeconds": 1800}}],
    },
    "httpRoute": {"enabled": True, "parentRefs": [{"name": "inference", "namespace": "gateways"}]},
    "modelServer": {"engine": "sglang"},
    "router": {"tracing": {"enabled": True, "endpoint": "http://otel-collector.observability:4318"}},
    "networkPolicy": {
        "trafficFrom": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "gateways"}}}],
        "adminFrom": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}],
    },
    "monitoring": {"podMonitor": {"enabled": True}},
}

#: Model chart sets (every one renders a model server Deployment).
WITH_WORKLOAD = [
    pytest.param({}, id="defaults"),
    pytest.param(FULL, id="full"),
    pytest.param(OTHER_SERVER, id="other-server"),
    pytest.param(CUSTOM_SERVER, id="custom-server"),
    pytest.param(INFERENCE_POOL, id="inference-pool"),
    pytest.param(POOL_WITHOUT_ROUTE, id="pool-without-route"),
    pytest.param(PLATFORM, id="platform"),
    pytest.param(KEDA, id="keda"),
    pytest.param(GRPC_VLLM, id="grpc-vllm"),
    pytest.param(GRPC_POOL, id="grpc-pool"),
    pytest.param(GRPC_TRITON, id="grpc-triton"),
    pytest.param(OVERLOAD, id="overload"),
    pytest.param(FRONT, id="front"),
]
ALL = WITH_WORKLOAD

#: Controller chart sets.
CONTROLLER_CLUSTER: dict[str, Any] = {
    "watch": {"allNamespaces": True},
    "features": {"inferencePools": True, "grpcRoutes": True, "forceDelete": True},
    "monitoring": {
        "serviceMonitor": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}},
        "dashboard": {"enabled": True, "namespace": "monitoring", "annotations": {"grafana_folder": "LLM"}},
    },
    "image": {"repository": "registry.example.com/drain-router", "tag": "0.1.0"},
}
CONTROLLER_NAMESPACES: dict[str, Any] = {"watch": {"namespaces": ["a", "b"]}}
CONTROLLER_MINIMAL: dict[str, Any] = {
    "features": {
        "httpRoutes": False,
        "grpcRoutes": False,
        "inferencePools": False,
        "recycling": False,
        "lifecycleRules": False,
    },
    "metricsPort": 0,
}
CONTROLLER_EXTRAS: dict[str, Any] = {
    # The controller pod's escape hatches.
    "podLabels": {"team": "platform"},
    "podSecurityContext": {"fsGroup": 10001},
    "initContainers": [{"name": "wait-for-api", "image": "registry.example.com/wait:1"}],
    "extraContainers": [{"name": "api-proxy", "image": "registry.example.com/proxy:1"}],
    "volumes": [{"name": "ca", "configMap": {"name": "corporate-ca"}}],
    "volumeMounts": [{"name": "ca", "mountPath": "/etc/ssl/corporate", "readOnly": True}],
    "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "platform", "effect": "NoSchedule"}],
    "nodeSelector": {"node-role.example.com/platform": "true"},
    "priorityClassName": "platform-critical",
    "monitoring": {
        "serviceMonitor": {
            "enabled": True,
            "serviceLabels": {"exposure": "internal"},
            "serviceAnnotations": {"example.com/scrape": "true"},
        }
    },
}
CONTROLLER_ACTIVATOR: dict[str, Any] = {
    # The activator for services scaled to zero; routes in the release's namespace and two others.
    "watch": {"namespaces": ["models", "serving", "research"]},
    "activator": {"enabled": True, "queueSize": 200, "activationTimeoutSeconds": 300},
    # Scraped: the activator's ServiceMonitor beside the controller's (validated against its CRD).
    "monitoring": {"serviceMonitor": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}}},
}
CONTROLLER_SETS = [
    pytest.param({}, id="controller-defaults"),
    pytest.param(CONTROLLER_CLUSTER, id="controller-cluster"),
    pytest.param(CONTROLLER_NAMESPACES, id="controller-namespaces"),
    pytest.param(CONTROLLER_MINIMAL, id="controller-minimal"),
    pytest.param(CONTROLLER_EXTRAS, id="controller-extras"),
    pytest.param(CONTROLLER_ACTIVATOR, id="controller-activator"),
]


def merged(overrides: dict[str, Any], *, values: Path = VALUES) -> dict[str, Any]:
    """The chart's defaults with ``overrides`` merged in, the way helm merges maps."""
    base = yaml.safe_load(values.read_text())

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
