"""make clean removes every build output and cache .gitignore names, and no tracked file.

A copy of the tracked files gets one instance of each ignored pattern (and the tools' own caches,
which ignore themselves); after ``make clean`` exactly the tracked files are left. A pattern added to
.gitignore without a way out in ``make clean`` fails here. CI checks the same on its used clone
(``.ci/run``: nothing untracked after ``make clean``).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# Caches that carry their own "*" .gitignore instead of a line in ours.
SELF_IGNORED = [".mypy_cache", ".ruff_cache", ".import_linter_cache"]


def tracked_files() -> list[str]:
    result = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True, timeout=30)
    if result.returncode != 0:
        pytest.skip("not a git checkout")
    return [f for f in result.stdout.split("\0") if f and (ROOT / f).is_file()]


def output_for(pattern: str) -> str:
    """One concrete path that the .gitignore pattern matches, as a file inside it when it is a directory."""
    concrete = pattern.strip("/").replace("*", "x")
    if concrete == "__pycache__":
        return "drain_router/http1/__pycache__/app.cpython-311.pyc"
    if concrete == "x.pyc":
        return "tests/stray.pyc"
    return f"{concrete}/file" if pattern.endswith("/") else concrete


@pytest.mark.skipif(shutil.which("make") is None, reason="make not installed")
def test_make_clean_removes_every_output_and_no_tracked_file(tmp_path: Path) -> None:
    tracked = tracked_files()
    for rel in tracked:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, tmp_path / rel)
    patterns = [
        line.strip()
        for line in (ROOT / ".gitignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    outputs = [output_for(p) for p in patterns] + [f"{d}/file" for d in SELF_IGNORED]
    outputs += [".venv-demo/bin/python", "bench/__pycache__/x.pyc", ".cache/helm/helm", ".cache/image/rootfs.tar"]
    for rel in outputs:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("output\n")

    result = subprocess.run(["make", "clean"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr

    left = {str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file()}
    assert left - set(tracked) == set(), "make clean left these behind"
    assert set(tracked) - left == set(), "make clean removed tracked files"
    empty_dirs = [str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_dir() and not any(p.iterdir())]
    assert empty_dirs == [], "an output directory is left, empty"
