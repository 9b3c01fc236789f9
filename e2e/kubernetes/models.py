"""A model service as a user installs it: the model chart's values for the fake model server (or the
real engine) behind the router, with an HTTPRoute the gateway serves by its hostname."""

from __future__ import annotations

from typing import Any

from drain_router import __version__

#: The fake model server's pace: a stream of CHUNKS chunks INTERVAL_MS apart (about 2 s).
CHUNKS = 40
INTERVAL_MS = 50


def hostname(namespace: str, release: str) -> str:
    return f"{release}.{namespace}.example"


def fake_model_values(
    namespace: str,
    release: str,
    *,
    replicas: int = 2,
    drain_secs: int = 4,
    grace_secs: int = 30,
    model_service: bool = False,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The model chart's values: ``replicas`` pods of router + fake model server, the router's readiness
    probed every second (one failure out), ``drain_secs`` of drain above that window."""
    values: dict[str, Any] = {
        "image": {"repository": "drain-router", "tag": __version__},
        "terminationGraceSecs": grace_secs,
        "shutdownDrainSecs": drain_secs,
        "workload": {"replicas": replicas},
        "router": {"readinessProbe": {"periodSeconds": 1, "failureThreshold": 1}},
        "modelServer": {
            "engine": "custom",
            "image": {"repository": "drain-router-dev", "tag": __version__},
            "port": 8000,
            "args": ["fake-model", "--port", "8000", "--chunks", str(CHUNKS), "--interval-ms", str(INTERVAL_MS)],
            "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": None},
            "shmSize": "",
        },
        "httpRoute": {
            "enabled": True,
            "parentRefs": [{"name": "gateway"}],
            "hostnames": [hostname(namespace, release)],
        },
        "modelService": {"enabled": model_service},
    }
    for key, value in (extra or {}).items():
        values[key] = {**values.get(key, {}), **value} if isinstance(value, dict) else value
    return values


def engine_values(
    namespace: str, release: str, gguf: str, *, drain_secs: int = 3, grace_secs: int = 60
) -> dict[str, Any]:
    """The model chart's values for the real engine: llama.cpp's OpenAI-compatible server
    (llama-cpp-python, SmolLM2-135M from the GGUF at ``gguf`` on this machine) behind the router, one
    thread each, the router's readiness following the engine's ``/docs``."""
    values = fake_model_values(namespace, release, drain_secs=drain_secs, grace_secs=grace_secs)
    # The router notices a dead engine within 2 x 1 s + 1 s, inside the drain window.
    values["router"].update(
        upstreamHealthPath="/docs", upstreamHealthIntervalSecs=1, upstreamHealthTimeoutSecs=1,
        upstreamHealthFailureThreshold=2,
    )  # fmt: skip
    values["modelServer"] = {
        "engine": "custom",
        "image": {"repository": "llama-cpp-server", "tag": "0.3"},
        "port": 8000,
        "args": [
            "--model", gguf, "--model_alias", "smollm2-135m", "--host", "127.0.0.1", "--port", "8000",
            "--n_ctx", "512", "--n_threads", "1", "--n_threads_batch", "1", "--interrupt_requests", "False",
        ],
        "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": None},
        "shmSize": "",
    }  # fmt: skip
    return values
