"""The repository stands alone: its code, tests and docs never cite the planning documents it was
built from (their section numbers, the issue tracker's numbers), which a reader of the repository
cannot open. Public references (RFC sections, upstream projects' issues by their repository) are
fine."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PLANNING = re.compile(r"\bSPEC\b|\bSTYLE\.md\b|\b[Ii]ssues? #?\d+|\b[Tt]he issue's\b")
TEXT = {".py", ".md", ".yaml", ".yml", ".toml", ".txt", ".tpl", ".json", ".sh", ".cfg", ".ini", ""}


def _tracked() -> list[Path]:
    names = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return [ROOT / n for n in names.split() if Path(n).suffix in TEXT and (ROOT / n).is_file()]


def test_no_file_cites_a_planning_document() -> None:
    found = []
    for path in _tracked():
        if path == Path(__file__).resolve():
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        for number, line in enumerate(text.splitlines(), 1):
            if PLANNING.search(line):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:100]}")
    assert found == [], "\n".join(found)


def test_the_pattern_finds_what_it_is_for() -> None:
    for cited in ("see SPEC 4", "(issue 39)", "Issue 12's goals", "per STYLE.md", "the issue's comparison"):
        assert PLANNING.search(cited), cited
    for fine in ("RFC 9113 §8.1", "_SPECIAL = 1", "INVALID_SPEC", "h2spec", "kubernetes/kubernetes#79384"):
        assert not PLANNING.search(fine), fine


def test_the_readme_stays_short() -> None:
    """The README is the way in (one command for the main job, one for the tests); the reference
    lives in docs/."""
    lines = (ROOT / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines < 300, f"README.md has {lines} lines"
