"""Engine presets: each binds its model server to 127.0.0.1:<port>, points the router's health check
and the model server's own probes at its health path, and sets its drain flag from the one grace."""

from __future__ import annotations

from typing import Any

import pytest

from tests.chart import values_sets
from tests.chart.helm import Helm, containers, flag, model_deployment

ENGINES = {
    # engine: (image repository, port, the model flag, the host flag, a flag the image must not get)
    "vllm": ("vllm/vllm-openai", 8000, "--model", "--host"),
    "sglang": ("lmsysorg/sglang", 30000, "--model-path", "--host"),
    "tgi": ("ghcr.io/huggingface/text-generation-inference", 8000, "--model-id", "--hostname"),
    "llamacpp": ("ghcr.io/ggml-org/llama.cpp", 8000, "--hf-repo", "--host"),
}


def model_server(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return next(c for name, c in containers(docs).items() if name != "router")


@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_preset_binds_the_model_server_behind_the_router(helm: Helm, engine: str) -> None:
    repository, port, model_flag, host_flag = ENGINES[engine]
    docs = helm.template({"modelServer": {"engine": engine, "model": "org/model", "args": ["--extra", "1"]}})
    server = model_server(docs)
    args = server["args"]
    assert server["image"].split(":")[0] == repository and ":" in server["image"]
    assert flag(args, model_flag) == "org/model"
    assert flag(args, host_flag) == "127.0.0.1", "only the router may reach it"
    assert flag(args, "--port") == str(port)
    assert args[-2:] == ["--extra", "1"], "modelServer.args come after the preset's"
    router_args = containers(docs)["router"]["args"]
    assert flag(router_args, "--upstream") == f"http://127.0.0.1:{port}"
    assert flag(router_args, "--upstream-health-path") == "/health"
    health = f"http://127.0.0.1:{port}/health"
    for probe in ("startupProbe", "livenessProbe"):
        command = server[probe]["exec"]["command"]
        assert command[:2] == ["curl", "-fsS"] and health in command, (probe, command)
    assert "readinessProbe" not in server, "readiness is the router's (it follows the model server)"
    if engine == "sglang":
        assert server["command"] == ["python3", "-m", "sglang.launch_server"]
    else:
        assert "command" not in server, "the image's own entrypoint"


@pytest.mark.parametrize(("grace", "drain"), [(180, 30), (120, 45), (1900, 1800)])
def test_vllm_drain_flag_is_what_the_grace_leaves_after_the_drain(helm: Helm, grace: int, drain: int) -> None:
    docs = helm.template({"terminationGraceSecs": grace, "shutdownDrainSecs": drain})
    assert flag(model_server(docs)["args"], "--shutdown-timeout") == str(grace - drain)
    pod = model_deployment(docs)["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] == grace


@pytest.mark.parametrize("engine", ["sglang", "tgi", "llamacpp"])
def test_engines_without_a_drain_flag_get_none(helm: Helm, engine: str) -> None:
    args = model_server(helm.template({"modelServer": {"engine": engine}}))["args"]
    assert not [a for a in args if "shutdown" in a or "drain" in a or "graceful" in a]


def test_drain_flag_can_be_turned_off_for_older_images(helm: Helm) -> None:
    args = model_server(helm.template({"modelServer": {"engineDrainFlag": False}}))["args"]
    assert flag(args, "--shutdown-timeout") is None


def test_startup_probe_tolerates_a_long_model_load(helm: Helm) -> None:
    docs = helm.template()
    startup = model_server(docs)["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 1800, "30 minutes of loading"
    deployment = model_deployment(docs)["spec"]
    window = startup["periodSeconds"] * startup["failureThreshold"]
    assert deployment["progressDeadlineSeconds"] > window, "the rollout must outlast one model load"
    liveness = model_server(docs)["livenessProbe"]
    assert liveness["timeoutSeconds"] >= 5


#: The flag that turns an engine's /metrics on, where it is off by default (SGLang, llama.cpp server).
METRICS_FLAGS = {"sglang": "--enable-metrics", "llamacpp": "--metrics"}


@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_preset_relays_the_engines_metrics_uncounted(helm: Helm, engine: str) -> None:
    """Every preset sets --engine-metrics-path /metrics (what vLLM, SGLang, TGI and llama.cpp serve),
    with the engine's metrics flag where it needs one."""
    docs = helm.template({"modelServer": {"engine": engine}})
    assert flag(containers(docs)["router"]["args"], "--engine-metrics-path") == "/metrics"
    args = model_server(docs)["args"]
    for other, metrics_flag in METRICS_FLAGS.items():
        assert (metrics_flag in args) == (other == engine), (engine, metrics_flag)


@pytest.mark.parametrize(
    "values",
    [
        values_sets.CUSTOM_SERVER,
        {"modelServer": {"engine": "vllm"}, "router": {"engineMetricsPath": ""}},
        {"modelServer": {"engine": "vllm"}, "grpc": {"enabled": True}},
    ],
    ids=["custom", "empty", "vllm-grpc-only"],
)
def test_no_engine_metrics_path_disables_the_relay(helm: Helm, values: dict[str, Any]) -> None:
    """Passed as an empty flag, never left out: the router's default (/metrics) would relay a path
    the engine may not serve."""
    assert flag(containers(helm.template(values))["router"]["args"], "--engine-metrics-path") == ""


def test_custom_engine_is_passed_through(helm: Helm) -> None:
    docs = helm.template(values_sets.CUSTOM_SERVER)
    server = model_server(docs)
    assert server["image"] == "registry.example.com/my-server:2.1"
    assert server["command"] == ["my-server"] and server["args"] == ["--bind", "127.0.0.1:7000"]
    assert server["startupProbe"] == values_sets.CUSTOM_SERVER["modelServer"]["startupProbe"]
    assert "livenessProbe" not in server, "no health path known: no generated probe"
    router_args = containers(docs)["router"]["args"]
    assert flag(router_args, "--upstream") == "http://127.0.0.1:7000"
    assert flag(router_args, "--upstream-health-path") == "/ping"


def test_an_empty_health_path_turns_off_the_health_check_but_not_the_preset(helm: Helm) -> None:
    docs = helm.template({"router": {"upstreamHealthPath": ""}})
    assert flag(containers(docs)["router"]["args"], "--upstream-health-path") is None
    assert "startupProbe" not in model_server(docs)


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        pytest.param({"modelServer": {"engine": "triton"}}, "/modelServer/engine", id="unknown-engine"),
        pytest.param({"modelServer": {"probes": {"readiness": {}}}}, "readiness", id="unbuilt-probe"),
        pytest.param({"modelServer": {"readinessProbe": {}}}, "readinessProbe", id="removed-value"),
        pytest.param({"workload": {"enabled": False}}, "enabled", id="controller-only-mode-is-gone"),
        pytest.param({"controller": {"enabled": True}}, "controller", id="controller-moved-to-its-chart"),
    ],
)
def test_schema_refuses_what_is_not_built(helm: Helm, values: dict[str, Any], expected: str) -> None:
    error = helm.template_error(values)
    assert "schema" in error and expected in error, error


def test_custom_engine_needs_an_image_and_a_port(helm: Helm) -> None:
    assert "needs modelServer.image.repository" in helm.template_error({"modelServer": {"engine": "custom"}})
    error = helm.template_error({"modelServer": {"engine": "custom", "image": {"repository": "x", "tag": "1"}}})
    assert "needs modelServer.port" in error


def test_pod_level_values(helm: Helm) -> None:
    pod = model_deployment(helm.template(values_sets.FULL))
    spec = pod["spec"]["template"]["spec"]
    assert pod["spec"]["progressDeadlineSeconds"] == 5400
    assert spec["serviceAccountName"] == "llama-weights"
    assert spec["automountServiceAccountToken"] is True
    assert spec["runtimeClassName"] == "nvidia"
    assert [c["name"] for c in spec["initContainers"]] == ["fetch-weights"]
    defaults = model_deployment(helm.template())["spec"]["template"]["spec"]
    assert "serviceAccountName" not in defaults and "runtimeClassName" not in defaults
    assert defaults["automountServiceAccountToken"] is False


def test_both_containers_request_cpu_and_memory(helm: Helm) -> None:
    for container in containers(helm.template()).values():
        assert {"cpu", "memory"} <= set(container["resources"]["requests"]), container["name"]
    assert "cpu" not in containers(helm.template())["router"]["resources"].get("limits", {}), "no CPU throttling"
