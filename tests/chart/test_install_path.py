"""The one install path: the README's `helm install` commands, rendered with real helm exactly as
written (release, chart, namespace, flags, the values file the README shows), install defaults that
work together:

- the controller's pod may reach each model pod's router admin port (its idle probe) under the
  model chart's rendered NetworkPolicy, evaluated as Kubernetes would (:mod:`tests.chart.netpol`);
- the controller watches the model's namespace and its RBAC there covers every object the model
  chart can hand it in a ModelService, every route kind included;
- docs/install.md, docs/kubernetes.md, the charts' READMEs and dist/INSTALL.txt give the same
  commands (the chart directory or its packaged archive aside) and the same values file.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.chart import crds, netpol, values_sets
from tests.chart.helm import CHART, CONTROLLER_CHART, KUBE_VERSION, REPO, Helm, RenderError, find, one

README = REPO / "README.md"
INSTALL_MD = REPO / "docs" / "install.md"
KUBERNETES_MD = REPO / "docs" / "kubernetes.md"
DIST_SH = REPO / "scripts" / "dist.sh"
CHARTS = {chart.name: chart for chart in (CHART, CONTROLLER_CHART)}
VALUES_BLOCK = re.compile(r"<!-- install-values:begin -->\s*```yaml\n(.*?)```\s*<!-- install-values:end -->", re.S)


@dataclasses.dataclass(frozen=True)
class Install:
    """One `helm install` of one of the two charts, the chart reference normalized to its name."""

    release: str
    chart: str
    namespace: str
    flags: tuple[str, ...]


def _chart_name(reference: str) -> str:
    """`charts/<name>` (a checkout) or `<name>-<version>.tgz` (a release's archive)."""
    for name, path in CHARTS.items():
        version = yaml.safe_load((path / "Chart.yaml").read_text())["version"]
        if reference in (f"charts/{name}", f"{name}-{version}.tgz", f"dist/{name}-{version}.tgz"):
            return name
    raise AssertionError(f"helm install of an unknown chart {reference!r}")


def _parse(command: str) -> Install | None:
    words = shlex.split(command, comments=True)
    if words[:2] != ["helm", "install"]:
        return None
    release, chart, *rest = words[2:]
    namespace, flags = None, []
    while rest:
        word = rest.pop(0)
        if word in ("-n", "--namespace"):
            namespace = rest.pop(0)
        elif word in ("--set", "-f", "--values"):
            flags += [word, rest.pop(0)]
        else:
            flags.append(word)
    assert namespace, f"{command!r} names no namespace"
    return Install(release, _chart_name(chart), namespace, tuple(flags))


def _logical_lines(script: str) -> list[str]:
    """Shell lines with backslash-newline continuations joined."""
    return script.replace("\\\n", " ").splitlines()


def installs_in_markdown(path: Path) -> list[Install]:
    """Every `helm install` of the two charts in the file's ```sh blocks, in order."""
    found = []
    for block in re.findall(r"```sh\n(.*?)```", path.read_text(), flags=re.S):
        found += [i for line in _logical_lines(block) if line.strip() and (i := _parse(line))]
    return found


def installs_in_dist_sh() -> list[Install]:
    """The `helm install` commands scripts/dist.sh echoes into dist/INSTALL.txt."""
    version = yaml.safe_load((CHART / "Chart.yaml").read_text())["version"]
    echoed = re.findall(r'^\s*echo "(.*)"$', DIST_SH.read_text(), flags=re.M)
    text = "\n".join(line.replace("\\\\", "\\").replace("$VERSION", version) for line in echoed)
    return [i for line in _logical_lines(text) if "helm install" in line and (i := _parse(line.strip()))]


def values_files(path: Path) -> dict[str, str]:
    """The install-values blocks of the file, by the file name on their first line (`# llama.yaml`)."""
    files = {}
    for block in VALUES_BLOCK.findall(path.read_text()):
        first = block.splitlines()[0]
        assert re.fullmatch(r"# \S+\.yaml", first), f"{path.name}: a values block starts with {first!r}"
        files[first[2:]] = block
    return files


def readme_installs() -> tuple[Install, Install]:
    installs = installs_in_markdown(README)
    assert [i.chart for i in installs] == ["drain-router-controller", "drain-router"], (
        f"README.md: expected the controller install, then the model install, got {installs}"
    )
    return installs[0], installs[1]


def render(helm: Helm, install: Install, files: dict[str, str], tmp_path: Path) -> list[dict[str, Any]]:
    """`helm template` with the install's own arguments; `-f <file>` reads the README's block of that name."""
    args = ["template", install.release, str(CHARTS[install.chart]), "--namespace", install.namespace]
    flags = list(install.flags)
    while flags:
        word = flags.pop(0)
        if word in ("-f", "--values"):
            name = flags.pop(0)
            assert name in files, f"the README installs with -f {name} but shows no such values block"
            path = tmp_path / name
            path.write_text(files[name])
            args += ["-f", str(path)]
        elif word == "--set":
            args += ["--set", flags.pop(0)]
        elif word != "--create-namespace":
            raise AssertionError(f"an install flag this test cannot render: {word}")
    done = helm.run(*args, "--kube-version", KUBE_VERSION)
    if done.returncode != 0:
        raise RenderError(done.stderr)
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


@pytest.fixture
def rendered(helm: Helm, tmp_path: Path) -> tuple[Install, list[dict[str, Any]], Install, list[dict[str, Any]]]:
    controller, model = readme_installs()
    files = values_files(README)
    return controller, render(helm, controller, files, tmp_path), model, render(helm, model, files, tmp_path)


def _controller_pod(install: Install, docs: list[dict[str, Any]]) -> netpol.Pod:
    return netpol.Pod.of(one(docs, "Deployment"), install.namespace)


def test_the_controller_reaches_the_model_pods_admin_port(rendered: Any) -> None:
    """1. render both charts as the README installs them 2. take the controller's pod (its namespace
    and labels) and the model's pod, and the port the ModelService tells the controller to probe
    3. evaluate the model chart's NetworkPolicy. Result: the idle probe is admitted, and the same
    pod in another namespace, or a pod of the model's namespace, is not."""
    controller_install, controller_docs, model_install, model_docs = rendered
    controller = _controller_pod(controller_install, controller_docs)
    model = netpol.Pod.of(one(model_docs, "Deployment"), model_install.namespace)
    admin_port = one(model_docs, "ModelService")["spec"]["router"]["adminPort"]
    router = next(
        c for c in one(model_docs, "Deployment")["spec"]["template"]["spec"]["containers"] if c["name"] == "router"
    )
    assert {"name": "admin", "containerPort": admin_port} in [
        {k: p[k] for k in ("name", "containerPort")} for p in router["ports"]
    ], "the ModelService's adminPort is the router's admin port"
    assert find(model_docs, "NetworkPolicy"), "the README's install renders a NetworkPolicy"
    assert netpol.ingress_allowed(model_docs, controller, model, admin_port), (
        f"the model chart's NetworkPolicy refuses the controller ({controller.namespace}, {controller.labels}) "
        f"on the admin port {admin_port}: recycling would never see an idle pod"
    )
    elsewhere = dataclasses.replace(controller, namespace=f"not-{controller.namespace}")
    assert not netpol.ingress_allowed(model_docs, elsewhere, model, admin_port), "the policy admits any namespace"
    neighbour = netpol.Pod(namespace=model_install.namespace, labels={"app": "client"})
    assert not netpol.ingress_allowed(model_docs, neighbour, model, admin_port), "the admin port is open to all"


def _granted(docs: list[dict[str, Any]], controller_namespace: str, namespace: str) -> set[tuple[str, str, str]]:
    """(apiGroup, resource, verb) the controller's service account may use in ``namespace``: the
    ClusterRoles bound to it by ClusterRoleBindings, and the Roles of ``namespace`` bound by
    RoleBindings there."""
    sa = one(docs, "ServiceAccount")["metadata"]["name"]
    subject = {"kind": "ServiceAccount", "name": sa, "namespace": controller_namespace}
    roles: list[dict[str, Any]] = []
    for binding in find(docs, "ClusterRoleBinding") + find(docs, "RoleBinding"):
        if binding["kind"] == "RoleBinding" and binding["metadata"]["namespace"] != namespace:
            continue
        if subject not in binding["subjects"]:
            continue
        ref = binding["roleRef"]
        roles += [
            r
            for r in find(docs, ref["kind"], ref["name"])
            if ref["kind"] == "ClusterRole" or r["metadata"]["namespace"] == namespace
        ]
    return {
        (group, resource, verb)
        for role in roles
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


BUILTIN_RESOURCES = {("apps", "Deployment"): "deployments", ("", "Service"): "services"}


def _resource(ref: dict[str, str]) -> tuple[str, str]:
    """(apiGroup, plural) of a ModelService reference, the plural from the kind's CRD when it has one."""
    group = ref["apiVersion"].rpartition("/")[0]
    if (group, ref["kind"]) in BUILTIN_RESOURCES:
        return group, BUILTIN_RESOURCES[(group, ref["kind"])]
    crd_file = crds.CRD_FILES.get((ref["apiVersion"], ref["kind"]))
    assert crd_file, f"no CRD for {ref}"
    return group, yaml.safe_load(crd_file.read_text())["spec"]["names"]["plural"]


ROUTE_GROUPS = ("gateway.networking.k8s.io", "inference.networking.k8s.io")

#: Model releases that render each route kind into the ModelService: the README's own values, then
#: with an InferencePool behind the HTTPRoute, HTTP and gRPC routes side by side (Triton), a
#: GRPCRoute to a pool (SGLang in gRPC mode), a GRPCRoute to the Service (vLLM in gRPC mode), and a
#: pool without a route of its own.
ROUTE_VARIANTS = {
    "readme": {},
    "http-pool": values_sets.INFERENCE_POOL,
    "http-and-grpc": {
        **values_sets.GRPC_TRITON,
        "grpcRoute": {"enabled": True, "parentRefs": [{"name": "inference"}]},
    },
    "grpc-pool": {**values_sets.GRPC_POOL, "httpRoute": {"enabled": False}},
    "grpc-service": {
        "grpc": {"enabled": True},
        "httpRoute": {"enabled": False},
        "grpcRoute": {"enabled": True, "parentRefs": [{"name": "inference"}]},
    },
    "pool-only": {**values_sets.POOL_WITHOUT_ROUTE, "httpRoute": {"enabled": False}},
}


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def _namespaced(install: Install, namespace: str) -> Install:
    """The README's namespaced alternative: watch.namespaces={<namespace>} instead of allNamespaces."""
    assert "watch.allNamespaces=true" in install.flags
    flags = tuple(f"watch.namespaces={{{namespace}}}" if f == "watch.allNamespaces=true" else f for f in install.flags)
    assert f"--set 'watch.namespaces={{{namespace}}}'" in README.read_text(), "the README names the alternative"
    return dataclasses.replace(install, flags=flags)


@pytest.mark.parametrize("scope", ["readme", "namespaced"])
@pytest.mark.parametrize("variant", sorted(ROUTE_VARIANTS))
def test_the_controllers_rbac_covers_every_route_kind_the_model_chart_renders(
    helm: Helm, tmp_path: Path, variant: str, scope: str
) -> None:
    """1. render the controller as the README installs it (or with its namespaced alternative)
    2. render the model chart with the README's values and a variant that renders a route kind
    3. collect what the ModelService names. Result: every route the release renders is in the
    ModelService, and the controller watches that namespace and may get and delete each object it
    names (else the teardown stops at a 403)."""
    controller_install, model_install = readme_installs()
    if scope == "namespaced":
        controller_install = _namespaced(controller_install, model_install.namespace)
    files = values_files(README)
    controller_docs = render(helm, controller_install, files, tmp_path)
    (values_name,) = [model_install.flags[i + 1] for i, f in enumerate(model_install.flags) if f == "-f"]
    values = _merge(yaml.safe_load(files[values_name]), ROUTE_VARIANTS[variant])
    model_docs = helm.template(values, release=model_install.release, namespace=model_install.namespace)
    spec = one(model_docs, "ModelService")["spec"]
    refs = [*spec["workload"], *([spec["route"]] if "route" in spec else [])]
    named = {(r["kind"], r["name"]) for r in refs}
    for doc in model_docs:
        if doc["apiVersion"].rpartition("/")[0] in ROUTE_GROUPS:
            assert (doc["kind"], doc["metadata"]["name"]) in named, (
                f"{doc['kind']} rendered but not in the ModelService"
            )
    args = one(controller_docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--all-namespaces" in args or model_install.namespace in args, "the controller does not watch the models"
    granted = _granted(controller_docs, controller_install.namespace, model_install.namespace)
    for verb in ("get", "list", "watch", "patch"):
        assert ("drainrouter.dev", "modelservices", verb) in granted
    for ref in refs:
        group, resource = _resource(ref)
        for verb in ("get", "delete"):
            assert (group, resource, verb) in granted, (
                f"the README's controller may not {verb} {resource}.{group or 'core'} in {model_install.namespace}: "
                f"{ref['kind']} {ref['name']} would stop the teardown"
            )


def test_every_doc_installs_the_way_the_readme_does() -> None:
    """docs/install.md, docs/kubernetes.md and dist/INSTALL.txt give the README's two commands, and
    each chart's README its own one; a checkout's chart directory and a release's archive are the
    same chart. The values file the commands name is the same block everywhere it is shown."""
    controller, model = readme_installs()
    assert controller.namespace == "drain-router-system"
    for path in (INSTALL_MD, KUBERNETES_MD):
        assert installs_in_markdown(path) == [controller, model], f"{path.relative_to(REPO)} installs otherwise"
        assert values_files(path) == values_files(README), f"{path.relative_to(REPO)} shows another values file"
    assert installs_in_dist_sh() == [controller, model], "dist/INSTALL.txt (scripts/dist.sh) installs otherwise"
    for install in (controller, model):
        chart_readme = CHARTS[install.chart] / "README.md"
        assert installs_in_markdown(chart_readme)[:1] == [install], f"{chart_readme.relative_to(REPO)}'s first line"


def test_the_parser_reads_continuations_comments_and_both_chart_references(tmp_path: Path) -> None:
    path = tmp_path / "doc.md"
    path.write_text("x\n```sh\nhelm install a charts/drain-router -n m \\\n  --set b=c   # note\nhelm list\n```\n")
    assert installs_in_markdown(path) == [Install("a", "drain-router", "m", ("--set", "b=c"))]
    version = yaml.safe_load((CONTROLLER_CHART / "Chart.yaml").read_text())["version"]
    assert _parse(f"helm install a drain-router-controller-{version}.tgz --namespace n") == Install(
        "a", "drain-router-controller", "n", ()
    )
