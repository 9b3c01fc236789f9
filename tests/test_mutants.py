"""The mutation pass's list (``tests/mutants.yaml``, run by ``make mutate``) cannot rot silently: every
mutant's original text still occurs exactly once in its file, and every test it names exists. A
rename in the code fails here, on every ``make test``, instead of turning the mutant into a no-op."""

from __future__ import annotations

import importlib.util
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("mutate", ROOT / "scripts" / "mutate.py")
assert _spec is not None and _spec.loader is not None
mutate = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("mutate", mutate)  # dataclasses look their module up there
_spec.loader.exec_module(mutate)


def test_every_mutant_still_applies_exactly_once() -> None:
    mutants = mutate.load()
    assert len(mutants) >= 45
    assert mutate.problems(mutants) == []


def test_a_stale_snippet_is_reported(tmp_path: pathlib.Path) -> None:
    (tmp_path / "a.py").write_text("x = 1\nx = 1\n")
    (tmp_path / "t.py").write_text("")
    twice = mutate.Mutant(id="m", rule="r", edits=(mutate.Edit("a.py", "x = 1", "x = 2"),), tests=("t.py",))
    gone = mutate.Mutant(id="n", rule="r", edits=(mutate.Edit("a.py", "y = 1", "y = 2"),), tests=("missing.py",))
    found = mutate.problems([twice, gone], root=tmp_path)
    assert found == [
        "m: the original occurs 2 times in a.py, not once: 'x = 1'",
        "n: the original occurs 0 times in a.py, not once: 'y = 1'",
        "n: test path missing.py does not exist",
    ]
