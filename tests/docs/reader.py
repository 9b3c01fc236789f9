"""A directory laid out as a reader's who follows the docs' helm commands."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from tests.chart.helm import CHART, CONTROLLER_CHART
from tests.docs.commands import REPO

VALUES_BLOCK = re.compile(r"<!-- install-values:begin -->\s*```yaml\n(.*?)```", re.S)


def reader_dir(directory: Path, helm: Path) -> Path:
    """Where a reader runs the docs' helm commands: `charts/` of the checkout, the values file the
    docs show (llama.yaml), and both charts packaged as a release's archives; a helm home of its own."""
    (directory / "charts").symlink_to(REPO / "charts")
    (directory / "llama.yaml").write_text(VALUES_BLOCK.findall((REPO / "README.md").read_text())[0])
    for chart in (CHART, CONTROLLER_CHART):
        subprocess.run([str(helm), "package", str(chart), "-d", str(directory)], check=True, capture_output=True)
    return directory
