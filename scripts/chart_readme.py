"""Write each chart's README.md (charts/drain-router, charts/drain-router-controller) from the ``# --``
comments of its values.yaml.

Each ``# -- text`` comment (with the ``#`` lines that continue it) documents the key below it; the
default is that key's value in values.yaml. ``python3 scripts/chart_readme.py`` rewrites the file;
``--check`` exits 1 when it is not current (a test runs the same comparison).
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

CHARTS = Path(__file__).resolve().parents[1] / "charts"
CHART = CHARTS / "drain-router"
CONTROLLER_CHART = CHARTS / "drain-router-controller"
KEY = re.compile(r"^(\s*)([A-Za-z0-9_]+):")

#: Each chart's install line, from the archive `make dist` packages (dist/<chart>-<version>.tgz).
INSTALL = {
    "drain-router": "helm install llama {archive} -n models --create-namespace -f llama.yaml",
    "drain-router-controller": (
        "helm install drain-router-controller {archive} -n drain-router-system \\\n"
        "  --create-namespace --set watch.allNamespaces=true \\\n"
        "  --set image.repository=registry.example.com/drain-router"
    ),
}
PURPOSE = {
    "drain-router": "One release per model: the model server pod with the draining router in front of it.",
    "drain-router-controller": (
        "Once per cluster (or once per watched namespace): the ModelService CRD and the companion controller."
    ),
}

HEADER = """\
# {name} chart

```sh
{install}
```

{purpose}
`make dist` packages it as `dist/{archive}`;
from a checkout, `charts/{name}` installs the same chart.
The repository's README explains the chart as a whole and
[docs/kubernetes.md](../../docs/kubernetes.md) the budget, gRPC, autoscaling and the pod's escape hatches.

Generated from the `# --` comments of [values.yaml](values.yaml) by `scripts/chart_readme.py`; do
not edit by hand (`make chart-readme` rewrites it, and a test fails when it is stale).

| key | default | description |
| --- | --- | --- |
"""


def documented(text: str) -> Iterator[tuple[str, str]]:
    """(dotted key, description) for every key preceded by a ``# --`` comment, in file order. Only
    ``# --`` followed by a space (or nothing) starts one: a wrapped line that begins with a flag
    (``# --hf-repo ...``) continues the description above it."""
    stack: list[tuple[int, str]] = []
    description: list[str] = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped == "# --" or stripped.startswith("# -- "):
            description = [stripped[4:].strip()]
            continue
        if stripped.startswith("#"):
            if description:
                description.append(stripped[1:].strip())
            continue
        if not stripped:
            description = []
            continue
        match = KEY.match(line)
        if match is None:
            continue  # a list item or a continued value
        indent = len(match.group(1))
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, match.group(2)))
        if description:
            yield ".".join(key for _, key in stack), " ".join(description)
        description = []


def _lookup(values: Any, dotted: str) -> Any:
    for key in dotted.split("."):
        values = values[key]
    return values


def render(text: str, name: str = "drain-router") -> str:
    version = yaml.safe_load((CHARTS / name / "Chart.yaml").read_text())["version"]
    archive = f"{name}-{version}.tgz"
    values = yaml.safe_load(text)
    keys = dict(documented(text))
    rows = []
    for key, description in keys.items():
        value = _lookup(values, key)
        if isinstance(value, dict) and any(other.startswith(key + ".") for other in keys):
            default = "see below"  # its documented keys follow, each with its default
        else:
            default = json.dumps(value, separators=(", ", ": "))
        cell = description.replace("|", "\\|")
        shown = default if default == "see below" else f"`{default}`"
        rows.append(f"| `{key}` | {shown} | {cell} |")
    header = HEADER.format(
        name=name, archive=archive, install=INSTALL[name].format(archive=archive), purpose=PURPOSE[name]
    )
    return header + "\n".join(rows) + "\n"


def main(argv: list[str]) -> int:
    stale = 0
    for chart in (CHART, CONTROLLER_CHART):
        wanted = render((chart / "values.yaml").read_text(), chart.name)
        target = chart / "README.md"
        if "--check" in argv:
            current = target.read_text() if target.exists() else ""
            if current != wanted:
                print(f"{target} is stale: run python3 scripts/chart_readme.py", file=sys.stderr)
                stale = 1
        else:
            target.write_text(wanted)
    return stale


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
