"""The "restricted" Pod Security Standard: every pod both charts render passes its controls
(``tests/chart/pod_security.py``), and each control is seen failing on a pod that breaks it. The
engine presets' securityContext and writable emptyDirs, the llama.cpp preset's pinned build tag."""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from typing import Any

import pytest

from tests.chart import values_sets
from tests.chart.helm import CONTROLLER_CHART, Helm, containers, find, model_deployment
from tests.chart.pod_security import CONTROLS, violations

ENGINES = ["vllm", "sglang", "tgi", "llamacpp"]
#: The containers the charts render themselves; initContainers and extraContainers are the user's,
#: passed through verbatim, and carry whatever securityContext the user gave them.
CHART_CONTAINERS = {"router", "front", "controller", "activator"}


def pod_templates(docs: list[dict[str, Any]], own: set[str]) -> list[dict[str, Any]]:
    """Every pod template of the rendered Deployments, less the user's pass-through containers."""
    templates = []
    for deployment in find(docs, "Deployment"):
        template = copy.deepcopy(deployment["spec"]["template"])
        for key in ("initContainers", "containers"):
            kept = [c for c in template["spec"].get(key, []) if c["name"] in own]
            template["spec"][key] = kept
        templates.append(template)
    return templates


@pytest.mark.parametrize(
    "values",
    [
        *(pytest.param({"modelServer": {"engine": e}}, id=e) for e in ENGINES),
        pytest.param(values_sets.CUSTOM_SERVER, id="custom"),
        *values_sets.WITH_WORKLOAD,
    ],
)
def test_every_model_pod_is_admitted_as_restricted(helm: Helm, values: dict[str, Any]) -> None:
    docs = helm.template(values)
    merged = values_sets.merged(values)
    name = merged["modelServer"]["name"]
    templates = {
        t["metadata"]["labels"]["app.kubernetes.io/component"]: t
        for t in pod_templates(docs, CHART_CONTAINERS | {name})
    }
    expected = {"model-server": ["router", name], **({"front": ["front"]} if merged["front"]["enabled"] else {})}
    assert {c: [x["name"] for x in t["spec"]["containers"]] for c, t in templates.items()} == expected
    for template in templates.values():
        assert violations(template) == {}


@pytest.mark.parametrize("values", [*values_sets.CONTROLLER_SETS, pytest.param({"activator": {"enabled": True}})])
def test_every_controller_and_activator_pod_is_admitted_as_restricted(helm: Helm, values: dict[str, Any]) -> None:
    templates = pod_templates(helm.template(values, chart=CONTROLLER_CHART), CHART_CONTAINERS)
    assert templates
    for template in templates:
        assert template["spec"]["containers"], "the chart's own container is checked"
        assert violations(template) == {}


def _container(name: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    def pick(spec: dict[str, Any]) -> dict[str, Any]:
        return next(c for c in spec["containers"] if c["name"] == name)

    return pick


ROUTER = _container("router")
MODEL = _container("model-server")


def _set(path: str, value: Any, on: Callable[[dict[str, Any]], dict[str, Any]] = lambda spec: spec) -> Any:
    def breaks(spec: dict[str, Any]) -> None:
        target = on(spec)
        *parents, last = path.split(".")
        for key in parents:
            target = target.setdefault(key, {})
        if value is None:
            target.pop(last, None)
        else:
            target[last] = value

    return breaks


def _add_volume(volume: dict[str, Any]) -> Callable[[dict[str, Any]], None]:
    return lambda spec: spec.setdefault("volumes", []).append(volume)


#: One row per control of the restricted profile: a change that breaks it, made to the default
#: model pod (which passes every control).
BREAKS: dict[str, Callable[[dict[str, Any]], None]] = {
    "HostProcess": _set("securityContext.windowsOptions", {"hostProcess": True}, MODEL),
    "Host Namespaces": _set("hostNetwork", True),
    "Privileged Containers": _set("securityContext.privileged", True, ROUTER),
    "HostPath Volumes": _add_volume({"name": "host", "hostPath": {"path": "/var/lib"}}),
    "Host Ports": lambda spec: ROUTER(spec)["ports"][0].update(hostPort=8080),
    "Host Probes / Lifecycle Hooks": _set("livenessProbe.httpGet.host", "10.0.0.1", ROUTER),
    "AppArmor": _set("securityContext.appArmorProfile", {"type": "Unconfined"}),
    "SELinux": _set("securityContext.seLinuxOptions", {"type": "spc_t"}, MODEL),
    "/proc Mount Type": _set("securityContext.procMount", "Unmasked", MODEL),
    "Sysctls": _set("securityContext.sysctls", [{"name": "kernel.msgmax", "value": "65536"}]),
    "Volume Types": _add_volume({"name": "nfs", "nfs": {"server": "nfs.example", "path": "/"}}),
    "Privilege Escalation": _set("securityContext.allowPrivilegeEscalation", None, MODEL),
    "Running as Non-root": _set("securityContext.runAsNonRoot", False, MODEL),
    "Running as Non-root user": _set("securityContext.runAsUser", 0, MODEL),
    "Seccomp": _set("securityContext.seccompProfile", {"type": "Unconfined"}, ROUTER),
    "Capabilities": _set("securityContext.capabilities", {"drop": ["ALL"], "add": ["NET_ADMIN"]}, MODEL),
}


#: A hostPath volume is also not one of the volume types restricted allows.
ALSO = {"HostPath Volumes": {"Volume Types"}}


def test_every_control_of_the_standard_has_a_row() -> None:
    assert list(BREAKS) == list(CONTROLS)


@pytest.mark.parametrize("control", list(BREAKS))
def test_a_pod_that_breaks_one_control_fails_that_control(helm: Helm, control: str) -> None:
    (template,) = pod_templates(helm.template(), CHART_CONTAINERS | {"model-server"})
    assert violations(template) == {}
    BREAKS[control](template["spec"])
    found = violations(template)
    assert control in found, found
    assert set(found) <= {control, *ALSO.get(control, ())}, found


@pytest.mark.parametrize(
    ("control", "change"),
    [
        # The annotation form of AppArmor, and the pod-wide settings the containers inherit.
        ("AppArmor", lambda t: t["metadata"]["annotations"].update({
            "container.apparmor.security.beta.kubernetes.io/router": "unconfined"})),
        ("Running as Non-root", lambda t: [c["securityContext"].pop("runAsNonRoot") for c in t["spec"]["containers"]]),
        ("Seccomp", lambda t: [t["spec"]["securityContext"].pop("seccompProfile"), MODEL(t["spec"])["securityContext"].pop("seccompProfile")]),
        ("Privilege Escalation", lambda t: t["spec"].setdefault("initContainers", []).append({"name": "init", "securityContext": {"runAsNonRoot": True, "capabilities": {"drop": ["ALL"]}}})),
        ("Capabilities", lambda t: ROUTER(t["spec"])["securityContext"].pop("capabilities")),
    ],
    ids=["apparmor-annotation", "non-root-nowhere", "seccomp-nowhere", "init-container", "no-drop"],
)  # fmt: skip
def test_more_ways_to_break_a_control(helm: Helm, control: str, change: Callable[[dict[str, Any]], Any]) -> None:
    (template,) = pod_templates(helm.template(), CHART_CONTAINERS | {"model-server"})
    change(template)
    assert list(violations(template)) == [control]


def _model(helm: Helm, values: dict[str, Any]) -> dict[str, Any]:
    return containers(helm.template(values))[values_sets.merged(values)["modelServer"]["name"]]


@pytest.mark.parametrize("engine", ENGINES)
def test_preset_runs_non_root_on_a_read_only_root_with_writable_home_and_tmp(helm: Helm, engine: str) -> None:
    values = {"modelServer": {"engine": engine}}
    docs = helm.template(values)
    server = _model(helm, values)
    assert server["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": 1000,
        "runAsGroup": 1000,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    env = {e["name"]: e.get("value") for e in server["env"]}
    assert env["HOME"] == "/home/model-server" and env["USER"] == "model-server"
    mounts = {m["mountPath"]: m["name"] for m in server["volumeMounts"]}
    writable = {"/home/model-server", "/tmp"} | ({"/data"} if engine == "tgi" else set())
    volumes = {v["name"]: v for v in model_deployment(docs)["spec"]["template"]["spec"]["volumes"]}
    for path in writable:
        assert volumes[mounts[path]] == {"name": mounts[path], "emptyDir": {}}, path
    assert "/data" in mounts or engine != "tgi", "TGI's HF_HOME is /data"


def test_custom_is_restricted_but_keeps_the_images_user_and_root_filesystem(helm: Helm) -> None:
    server = _model(helm, values_sets.CUSTOM_SERVER)
    assert server["securityContext"] == {
        "runAsNonRoot": True,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert "env" not in server
    assert [m["name"] for m in server["volumeMounts"]] == ["dshm"], "no preset emptyDir"


def test_the_users_keys_replace_the_presets_and_null_removes_one(helm: Helm) -> None:
    values = {
        "modelServer": {
            "securityContext": {
                "runAsUser": 2000,
                "readOnlyRootFilesystem": None,
                "seLinuxOptions": {"level": "s0:c1"},
            },
            "env": [{"name": "HOME", "value": "/models/home"}],
            "volumeMounts": [{"name": "scratch", "mountPath": "/tmp"}],
        },
        "workload": {"volumes": [{"name": "scratch", "emptyDir": {"medium": "Memory"}}]},
    }
    server = _model(helm, values)
    sc = server["securityContext"]
    assert sc["runAsUser"] == 2000 and "readOnlyRootFilesystem" not in sc
    assert sc["seLinuxOptions"] == {"level": "s0:c1"} and sc["runAsNonRoot"] is True
    assert [e for e in server["env"] if e["name"] == "HOME"] == [{"name": "HOME", "value": "/models/home"}]
    assert [m["name"] for m in server["volumeMounts"] if m["mountPath"] == "/tmp"] == ["scratch"]
    volumes = [v["name"] for v in model_deployment(helm.template(values))["spec"]["template"]["spec"]["volumes"]]
    assert "model-server-tmp" not in volumes and "model-server-home" in volumes


def test_a_volume_named_like_a_presets_emptydir_fails_the_render(helm: Helm) -> None:
    error = helm.template_error({"workload": {"volumes": [{"name": "model-server-home", "emptyDir": {}}]}})
    assert "model-server-home" in error and "already in the pod" in error


def test_llamacpp_preset_pins_a_build_tag(helm: Helm) -> None:
    """The moving ``server`` tag changes under a running Deployment; ``server-bNNNNN`` is one build."""
    image = _model(helm, {"modelServer": {"engine": "llamacpp"}})["image"]
    assert re.fullmatch(r"ghcr\.io/ggml-org/llama\.cpp:server-b\d+", image), image
