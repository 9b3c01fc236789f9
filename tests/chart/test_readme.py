"""The chart's README is generated from the values' ``# --`` comments and must be current."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest
import yaml

from tests.chart.helm import CHART, CONTROLLER_CHART, REPO


def _generator():
    spec = importlib.util.spec_from_file_location("chart_readme", REPO / "scripts" / "chart_readme.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("chart", [CHART, CONTROLLER_CHART], ids=lambda c: c.name)
def test_chart_readme_is_current(chart: Path) -> None:
    wanted = _generator().render((chart / "values.yaml").read_text(), chart.name)
    assert (chart / "README.md").read_text() == wanted, "stale: run make chart-readme"


def test_every_documented_key_exists_with_its_default() -> None:
    generator = _generator()
    text = (CHART / "values.yaml").read_text()
    keys = dict(generator.documented(text))
    assert "router.readinessProbe.periodSeconds" in keys
    assert keys["shutdownDrainSecs"].startswith("Seconds the router keeps serving after SIGTERM")
    rendered = generator.render(text)
    assert "| `networkPolicy.enabled` | `true` |" in rendered
    assert Path(CHART / "README.md").exists()


@pytest.mark.parametrize("chart", [CHART, CONTROLLER_CHART], ids=lambda c: c.name)
def test_chart_readme_starts_with_its_install_line(chart: Path) -> None:
    """The first thing under the title installs the archive `make dist` packages."""
    version = yaml.safe_load((chart / "Chart.yaml").read_text())["version"]
    lines = (chart / "README.md").read_text().splitlines()
    assert lines[0] == f"# {chart.name} chart"
    body = [line for line in lines[1:] if line]
    assert body[0] == "```sh"
    assert body[1].startswith("helm install ")
    assert f" {chart.name}-{version}.tgz " in body[1]


def test_make_dist_packages_both_charts() -> None:
    """scripts/dist.sh packages every chart in charts/ (two), and dist-check checks each archive."""
    charts = sorted(path.parent.name for path in (REPO / "charts").glob("*/Chart.yaml"))
    assert charts == ["drain-router", "drain-router-controller"]
    dist = (REPO / "scripts" / "dist.sh").read_text()
    assert sorted(re.findall(r'^"\$HELM" package charts/(\S+) ', dist, re.MULTILINE)) == charts
    check = (REPO / "scripts" / "dist-check.sh").read_text()
    for name in charts:
        assert f'"dist/{name}-$VERSION.tgz"' in check


def test_a_wrapped_line_that_starts_with_a_flag_continues_the_description() -> None:
    """``# --flag`` is a continuation (a flag wrapped to the line start), ``# -- text`` a new entry."""
    text = "# -- The model (vLLM --model, llama.cpp\n# --hf-repo). Ignored by custom.\nmodel: x\n"
    assert dict(_generator().documented(text)) == {
        "model": "The model (vLLM --model, llama.cpp --hf-repo). Ignored by custom."
    }
    keys = dict(_generator().documented((CHART / "values.yaml").read_text()))
    assert keys["modelServer.model"].endswith("llama.cpp --hf-repo). Ignored by custom.")
