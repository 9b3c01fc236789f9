"""What users install: the built wheel's metadata declares compatible ranges, only the user-facing extras,
and the exact tested set (constraints.txt) satisfies them; the development environment is that set.

The wheel is built once per run (``python -m build --wheel``), so these checks read the published
metadata itself, not pyproject.toml's intent.
"""

from __future__ import annotations

import email
import importlib.metadata
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
USER_EXTRAS = {"controller", "plot", "otel"}


def constraint_pins() -> dict[str, str]:
    pins: dict[str, str] = {}
    for raw in (ROOT / "constraints.txt").read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        req = Requirement(line)
        [spec] = req.specifier
        assert spec.operator == "==" and "*" not in spec.version, f"constraints.txt pins exactly: {line!r}"
        name = canonicalize_name(req.name)
        assert name not in pins, f"{name} is pinned twice"
        pins[name] = spec.version
    return pins


def dev_group(name: str) -> list[Requirement]:
    """A PEP 735 dependency group with its include-group entries expanded."""
    reqs = []
    for entry in PYPROJECT["dependency-groups"][name]:
        reqs += dev_group(entry["include-group"]) if isinstance(entry, dict) else [Requirement(entry)]
    return reqs


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--outdir", str(out), str(ROOT)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    [built] = out.glob("drain_router-*.whl")
    return built


@pytest.fixture(scope="module")
def wheel_metadata(wheel: Path) -> email.message.Message:
    with zipfile.ZipFile(wheel) as zf:
        [name] = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
        return email.message_from_bytes(zf.read(name))


@pytest.mark.slow
def test_the_runtime_wheel_carries_no_development_tool(wheel: Path) -> None:
    """The fake model server, the stand-in Kubernetes API, the load generators and the demo are the
    devtools distribution's: the product's wheel has the router, the activator and the controller."""
    with zipfile.ZipFile(wheel) as zf:
        modules = [n for n in zf.namelist() if n.endswith(".py")]
    tops = {n.split("/")[0] for n in modules}
    assert tops == {"drain_router"}, tops
    packages = {n.rsplit("/", 1)[0] for n in modules}
    assert not [p for p in packages if "tools" in p or "fake" in p or "demo" in p], sorted(packages)
    product = {"runtime", "http1", "http1/upstream", "http1/websocket", "h2", "grpc", "admission", "activator"}
    product |= {"controller", "controller/passes", "controller/kube", "decisions", "config", "tracing"}
    assert {f"drain_router/{p}" for p in product} <= packages, sorted(packages)


def test_the_devtools_requirements_are_pinned() -> None:
    """``make venv`` installs ./devtools with -c constraints.txt too: each of its dependencies has a
    tested version inside its range."""
    devtools = tomllib.loads((ROOT / "devtools" / "pyproject.toml").read_text(encoding="utf-8"))
    pins = constraint_pins()
    for entry in devtools["project"]["dependencies"]:
        req = Requirement(entry)
        name = canonicalize_name(req.name)
        if name == "drain-router":
            continue
        assert name in pins, f"devtools' {name} has no tested version in constraints.txt"
        assert req.specifier.contains(pins[name], prereleases=True), f"{name}=={pins[name]} vs {req}"


def requires(metadata: email.message.Message) -> list[Requirement]:
    return [Requirement(r) for r in metadata.get_all("Requires-Dist") or []]


def extra_of(req: Requirement) -> str | None:
    """The extra a Requires-Dist belongs to (``extra == "x"`` in its marker), None for the runtime."""
    if req.marker is None or "extra" not in str(req.marker):
        return None
    return next((e for e in USER_EXTRAS if req.marker.evaluate({"extra": e})), "?")


@pytest.mark.slow
def test_wheel_declares_ranges_not_pins(wheel_metadata: email.message.Message) -> None:
    """Each dependency has a lower bound at the tested minor and an upper bound; none is exact, so the
    wheel installs beside a package that needs a neighbouring version."""
    reqs = requires(wheel_metadata)
    assert reqs, "the wheel declares its dependencies"
    for req in reqs:
        ops = {spec.operator for spec in req.specifier}
        assert not ops & {"==", "==="}, f"an exact pin in the published metadata: {req}"
        assert ops == {">=", "<"}, f"a compatible range (>=tested minor, <next major): {req}"


@pytest.mark.slow
def test_wheel_extras_are_for_users_only(wheel_metadata: email.message.Message) -> None:
    assert set(wheel_metadata.get_all("Provides-Extra") or []) == USER_EXTRAS
    dev_tools = {canonicalize_name(r.name) for r in dev_group("dev")}
    runtime = {canonicalize_name(r.name) for r in requires(wheel_metadata) if extra_of(r) is None}
    for req in requires(wheel_metadata):
        assert extra_of(req) != "?", f"a requirement outside the user extras: {req}"
        name = canonicalize_name(req.name)
        assert name not in dev_tools or name in runtime, f"a development tool in the published metadata: {req}"
    published = {canonicalize_name(r.name) for r in requires(wheel_metadata)}
    assert not {"pytest", "hypothesis", "mypy", "ruff", "build"} & published


@pytest.mark.slow
def test_constraints_pin_every_dependency_inside_its_range(wheel_metadata: email.message.Message) -> None:
    pins = constraint_pins()
    for req in requires(wheel_metadata):
        name = canonicalize_name(req.name)
        assert name in pins, f"{name} has no tested version in constraints.txt"
        assert req.specifier.contains(pins[name], prereleases=True), (
            f"constraints.txt's {name}=={pins[name]} is outside the declared {req}"
        )


def test_constraints_pin_the_dev_group() -> None:
    """make venv installs the dev group with -c constraints.txt: every tool has a tested version."""
    pins = constraint_pins()
    for req in dev_group("dev"):
        name = canonicalize_name(req.name)
        assert name in pins, f"dev tool {name} has no tested version in constraints.txt"
        assert req.specifier.contains(pins[name], prereleases=True), f"{name}=={pins[name]} vs {req}"


def test_this_environment_is_the_tested_set() -> None:
    """The environment running these tests holds exactly constraints.txt's versions: what CI and the
    image install is what was tested."""
    pins = constraint_pins()
    installed = {
        canonicalize_name(d.metadata["Name"]): d.version
        for d in importlib.metadata.distributions()
        if canonicalize_name(d.metadata["Name"]) in pins
    }
    wrong = {name: (version, pins[name]) for name, version in installed.items() if version != pins[name]}
    assert not wrong, f"installed (version, constraints.txt): {wrong}; rebuild with make venv"
    missing = set(pins) - set(installed)
    if all(canonicalize_name(r.name) in installed for r in dev_group("engine")):
        assert not missing, f"pinned but not installed here: {sorted(missing)}"
    else:
        # Without `make engine`, only what the engine group alone needs may be absent.
        roots = [Requirement("drain-router[controller,demo,plot,otel]"), *dev_group("dev")]
        needed = missing & requirement_closure(roots)
        assert not needed, f"pinned but not installed here: {sorted(needed)}"


def requirement_closure(roots: list[Requirement]) -> set[str]:
    """The installed distributions ``roots`` need, transitively (extras and markers followed)."""
    seen: set[tuple[str, str]] = set()
    todo = [(r, extra) for r in roots for extra in ("", *r.extras)]
    while todo:
        req, extra = todo.pop()
        name = canonicalize_name(req.name)
        if (name, extra) in seen:
            continue
        seen.add((name, extra))
        try:
            requires = importlib.metadata.distribution(name).requires or []
        except importlib.metadata.PackageNotFoundError:
            continue
        for raw in requires:
            sub = Requirement(raw)
            if sub.marker is None or sub.marker.evaluate({"extra": extra}):
                todo += [(sub, e) for e in ("", *sub.extras)]
    return {name for name, _ in seen}
