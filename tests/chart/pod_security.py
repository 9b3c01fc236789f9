"""The Kubernetes Pod Security Standards' "restricted" profile, checked on a pod spec the way the
PodSecurity admission plugin checks it: one pure function per control of the standard's list (the
baseline controls, which restricted includes, then restricted's own), each answering the problems it
finds in plain words. A pod is admitted under ``enforce: restricted`` when no control finds one.

Written from the controls' table in the standard (Kubernetes' "Pod Security Standards" page, policy
version latest), not from the admission plugin's code: ``tests/chart/test_pod_security.py`` proves
each control by a pod that breaks it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

Spec = dict[str, Any]

#: Sysctls the baseline profile allows.
SAFE_SYSCTLS = frozenset(
    {
        "kernel.shm_rmid_forced",
        "net.ipv4.ip_local_port_range",
        "net.ipv4.ip_unprivileged_port_start",
        "net.ipv4.tcp_syncookies",
        "net.ipv4.ping_group_range",
        "net.ipv4.ip_local_reserved_ports",
        "net.ipv4.tcp_keepalive_time",
        "net.ipv4.tcp_fin_timeout",
        "net.ipv4.tcp_keepalive_intvl",
        "net.ipv4.tcp_keepalive_probes",
    }
)
SELINUX_TYPES = frozenset({"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"})
#: The volume types restricted allows.
VOLUME_TYPES = frozenset(
    {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected", "secret"}
)
HANDLER_KINDS = ("httpGet", "tcpSocket", "grpc", "exec", "sleep")


def containers(spec: Spec) -> Iterator[Spec]:
    """Every container of the pod: init, regular and ephemeral."""
    for key in ("initContainers", "containers", "ephemeralContainers"):
        yield from spec.get(key) or []


def _sc(obj: Spec) -> Spec:
    return obj.get("securityContext") or {}


def host_process(spec: Spec, annotations: dict[str, str]) -> list[str]:
    found = []
    for where, sc in [("pod", _sc(spec)), *((c["name"], _sc(c)) for c in containers(spec))]:
        if (sc.get("windowsOptions") or {}).get("hostProcess"):
            found.append(f"{where}: windowsOptions.hostProcess")
    return found


def host_namespaces(spec: Spec, annotations: dict[str, str]) -> list[str]:
    return [f"pod: {key}" for key in ("hostNetwork", "hostPID", "hostIPC") if spec.get(key)]


def privileged(spec: Spec, annotations: dict[str, str]) -> list[str]:
    return [f"{c['name']}: privileged" for c in containers(spec) if _sc(c).get("privileged")]


def host_path_volumes(spec: Spec, annotations: dict[str, str]) -> list[str]:
    return [f"volume {v['name']}: hostPath" for v in spec.get("volumes") or [] if "hostPath" in v]


def host_ports(spec: Spec, annotations: dict[str, str]) -> list[str]:
    return [
        f"{c['name']}: hostPort {p['hostPort']}"
        for c in containers(spec)
        for p in c.get("ports") or []
        if p.get("hostPort")
    ]


def host_probes(spec: Spec, annotations: dict[str, str]) -> list[str]:
    found = []
    for c in containers(spec):
        handlers = [(k, c.get(k) or {}) for k in ("livenessProbe", "readinessProbe", "startupProbe")]
        handlers += [(f"lifecycle.{k}", v) for k, v in (c.get("lifecycle") or {}).items()]
        for where, handler in handlers:
            for kind in ("httpGet", "tcpSocket"):
                if (handler.get(kind) or {}).get("host"):
                    found.append(f"{c['name']}: {where}.{kind}.host")
    return found


def app_armor(spec: Spec, annotations: dict[str, str]) -> list[str]:
    found = []
    for where, sc in [("pod", _sc(spec)), *((c["name"], _sc(c)) for c in containers(spec))]:
        kind = (sc.get("appArmorProfile") or {}).get("type")
        if kind not in (None, "RuntimeDefault", "Localhost"):
            found.append(f"{where}: appArmorProfile {kind}")
    for key, value in annotations.items():
        confined = value == "runtime/default" or value.startswith("localhost/")
        if key.startswith("container.apparmor.security.beta.kubernetes.io/") and not confined:
            found.append(f"annotation {key}: {value}")
    return found


def se_linux(spec: Spec, annotations: dict[str, str]) -> list[str]:
    found = []
    for where, sc in [("pod", _sc(spec)), *((c["name"], _sc(c)) for c in containers(spec))]:
        options = sc.get("seLinuxOptions") or {}
        if options.get("type", "") not in SELINUX_TYPES:
            found.append(f"{where}: seLinuxOptions.type {options['type']}")
        found += [f"{where}: seLinuxOptions.{key}" for key in ("user", "role") if options.get(key)]
    return found


def proc_mount(spec: Spec, annotations: dict[str, str]) -> list[str]:
    return [
        f"{c['name']}: procMount {_sc(c)['procMount']}"
        for c in containers(spec)
        if _sc(c).get("procMount", "Default") != "Default"
    ]


def sysctls(spec: Spec, annotations: dict[str, str]) -> list[str]:
    return [f"pod: sysctl {s['name']}" for s in _sc(spec).get("sysctls") or [] if s["name"] not in SAFE_SYSCTLS]


def volume_types(spec: Spec, annotations: dict[str, str]) -> list[str]:
    found = []
    for volume in spec.get("volumes") or []:
        kinds = set(volume) - {"name"}
        if not kinds <= VOLUME_TYPES:
            found.append(f"volume {volume['name']}: {', '.join(sorted(kinds - VOLUME_TYPES))}")
    return found


def privilege_escalation(spec: Spec, annotations: dict[str, str]) -> list[str]:
    return [
        f"{c['name']}: allowPrivilegeEscalation is not false"
        for c in containers(spec)
        if _sc(c).get("allowPrivilegeEscalation") is not False
    ]


def run_as_non_root(spec: Spec, annotations: dict[str, str]) -> list[str]:
    pod = _sc(spec).get("runAsNonRoot")
    found = ["pod: runAsNonRoot false"] if pod is False else []
    for c in containers(spec):
        own = _sc(c).get("runAsNonRoot")
        if own is False:
            found.append(f"{c['name']}: runAsNonRoot false")
        elif own is None and pod is not True:
            found.append(f"{c['name']}: runAsNonRoot unset (and not true for the pod)")
    return found


def run_as_user(spec: Spec, annotations: dict[str, str]) -> list[str]:
    found = ["pod: runAsUser 0"] if _sc(spec).get("runAsUser") == 0 else []
    return found + [f"{c['name']}: runAsUser 0" for c in containers(spec) if _sc(c).get("runAsUser") == 0]


def seccomp(spec: Spec, annotations: dict[str, str]) -> list[str]:
    allowed = ("RuntimeDefault", "Localhost")
    pod = (_sc(spec).get("seccompProfile") or {}).get("type")
    found = [f"pod: seccompProfile {pod}"] if pod is not None and pod not in allowed else []
    for c in containers(spec):
        own = (_sc(c).get("seccompProfile") or {}).get("type")
        if own is not None and own not in allowed:
            found.append(f"{c['name']}: seccompProfile {own}")
        elif own is None and pod not in allowed:
            found.append(f"{c['name']}: seccompProfile unset (and not RuntimeDefault or Localhost for the pod)")
    return found


def capabilities(spec: Spec, annotations: dict[str, str]) -> list[str]:
    found = []
    for c in containers(spec):
        caps = _sc(c).get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []):
            found.append(f"{c['name']}: capabilities.drop lacks ALL")
        found += [f"{c['name']}: adds {cap}" for cap in caps.get("add") or [] if cap != "NET_BIND_SERVICE"]
    return found


#: The restricted profile's controls: the baseline's, then restricted's own.
CONTROLS: dict[str, Callable[[Spec, dict[str, str]], list[str]]] = {
    "HostProcess": host_process,
    "Host Namespaces": host_namespaces,
    "Privileged Containers": privileged,
    "HostPath Volumes": host_path_volumes,
    "Host Ports": host_ports,
    "Host Probes / Lifecycle Hooks": host_probes,
    "AppArmor": app_armor,
    "SELinux": se_linux,
    "/proc Mount Type": proc_mount,
    "Sysctls": sysctls,
    "Volume Types": volume_types,
    "Privilege Escalation": privilege_escalation,
    "Running as Non-root": run_as_non_root,
    "Running as Non-root user": run_as_user,
    "Seccomp": seccomp,
    "Capabilities": capabilities,
}


def violations(template: Spec) -> dict[str, list[str]]:
    """The restricted controls a pod template (``metadata`` and ``spec``) breaks, with what breaks
    them; empty when the pod is admitted."""
    spec = template["spec"]
    annotations = (template.get("metadata") or {}).get("annotations") or {}
    found = {name: check(spec, annotations) for name, check in CONTROLS.items()}
    return {name: problems for name, problems in found.items() if problems}
