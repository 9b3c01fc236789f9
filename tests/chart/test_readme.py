"""The chart's README is generated from the values' ``# --`` comments and must be current."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

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
