"""The README's install step renders as it says: its values file, given to the model chart as
written, yields a route whose timeouts a gateway's default cannot undercut, and pods that pull the
image from where the README's first step pushed it."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from tests.chart import crds
from tests.chart.helm import CHART, CONTROLLER_CHART, Helm, model_deployment, one

README = Path(__file__).resolve().parents[2] / "README.md"
BEGIN, END = "<!-- install-values:begin -->", "<!-- install-values:end -->"


def readme_values() -> dict[str, Any]:
    text = README.read_text()
    found = re.search(re.escape(BEGIN) + r"\s*```yaml\n(.*?)```\s*" + re.escape(END), text, flags=re.S)
    assert found, f"README.md has no ```yaml block between {BEGIN} and {END}"
    values = yaml.safe_load(found.group(1))
    assert isinstance(values, dict)
    return values


def app_version(chart: Path) -> str:
    return str(yaml.safe_load((chart / "Chart.yaml").read_text())["appVersion"])


def test_the_readme_values_render_a_route_with_timeouts(helm: Helm) -> None:
    """1. render the model chart with the README's values 2. read the HTTPRoute.
    Result: every rule carries request and backendRequest timeouts of at least an hour (a gateway's
    default, 15 s on some, would cut a long stream), and the route validates against its CRD."""
    docs = helm.template(readme_values())
    route = one(docs, "HTTPRoute")
    crds.validate(route)
    for rule in route["spec"]["rules"]:
        timeouts = rule.get("timeouts")
        assert timeouts, rule
        for key in ("request", "backendRequest"):
            assert re.fullmatch(r"\d+s", timeouts[key]) and int(timeouts[key][:-1]) >= 3600, timeouts


def test_the_readme_values_pull_the_image_the_readme_pushed(helm: Helm) -> None:
    """The router runs <image.repository>:<appVersion>, the tag the README's build and push use, and the
    controller install names the same repository."""
    values = readme_values()
    repository = values["image"]["repository"]
    router = next(
        c
        for c in model_deployment(helm.template(values))["spec"]["template"]["spec"]["containers"]
        if c["name"] == "router"
    )
    version = app_version(CHART)
    assert router["image"] == f"{repository}:{version}"
    text = README.read_text()
    # scripts/build-image.sh (make image) tags localhost/drain-router:<version>
    assert f"buildah push localhost/drain-router:{version} docker://{repository}:{version}" in text, (
        "step 1 pushes elsewhere"
    )
    assert f"--set image.repository={repository}" in text, "the controller install names another repository"
    assert app_version(CONTROLLER_CHART) == version
