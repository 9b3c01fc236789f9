"""Load table-test cases from tests/cases/, relative to this file (never the working directory)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

CASES = Path(__file__).parent / "cases"


def load(relative: str) -> Any:
    with (CASES / relative).open(encoding="utf-8") as fh:
        return yaml.safe_load(fh)


def params(rows: list[dict[str, Any]]) -> list[Any]:
    return [pytest.param(row, id=row["id"]) for row in rows]
