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
