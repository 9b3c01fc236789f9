"""The mutation pass: break one rule at a time and check that the tests named for it fail.

``tests/mutants.yaml`` lists the mutants. Each one is an ``id``, the ``rule`` it breaks (in the
spec's words), one or more ``edits`` (``file``, the exact ``original`` text, which must occur exactly
once in that file, and its ``replacement``) and ``tests``, the pytest selection that must fail with
the mutant applied.

The pass copies the tracked files of the checkout into a temporary directory once, then for each
mutant applies its edits there, runs its selection (``-x``, with a timeout) with the copy first on
``sys.path``, and restores the files. The checkout itself is never written. A mutant whose tests
fail is killed; one whose tests pass survived. The pass prints a table and ``killed K/N`` and exits
non-zero when any mutant survived or any ``original`` no longer matches exactly once.

    python scripts/mutate.py                  # every mutant
    python scripts/mutate.py ID [ID ...]      # only these
    python scripts/mutate.py --check          # only check that every original matches once
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

import yaml

ROOT = pathlib.Path(__file__).resolve().parent.parent
MUTANTS = ROOT / "tests" / "mutants.yaml"
TIMEOUT_SECS = 300.0
"""One mutant's whole pytest run; past it the run is stopped and the mutant counts as killed (timeout)."""


@dataclasses.dataclass(frozen=True)
class Edit:
    file: str
    original: str
    replacement: str


@dataclasses.dataclass(frozen=True)
class Mutant:
    id: str
    rule: str
    edits: tuple[Edit, ...]
    tests: tuple[str, ...]
    note: str = ""


def load(path: pathlib.Path = MUTANTS) -> list[Mutant]:
    """The mutants of ``path``; raises ``ValueError`` for a malformed entry or a repeated id."""
    raw = yaml.safe_load(path.read_text())
    out: list[Mutant] = []
    for entry in raw:
        edits_raw: list[dict[str, Any]] = entry.get("edits") or [
            {k: entry[k] for k in ("file", "original", "replacement")}
        ]
        edits = tuple(Edit(file=e["file"], original=e["original"], replacement=e["replacement"]) for e in edits_raw)
        tests = entry["tests"]
        if isinstance(tests, str):
            tests = [tests]
        mutant = Mutant(id=entry["id"], rule=entry["rule"], edits=edits, tests=tuple(tests), note=entry.get("note", ""))
        if not mutant.tests or not mutant.edits:
            raise ValueError(f"{mutant.id}: needs edits and tests")
        out.append(mutant)
    ids = [m.id for m in out]
    repeated = sorted({i for i in ids if ids.count(i) > 1})
    if repeated:
        raise ValueError(f"repeated mutant ids: {repeated}")
    return out


def problems(mutants: list[Mutant], root: pathlib.Path = ROOT) -> list[str]:
    """Everything that would make a mutant meaningless: an ``original`` that does not occur exactly
    once in its file, a replacement equal to it, a test file that does not exist."""
    out = []
    for m in mutants:
        for e in m.edits:
            path = root / e.file
            if not path.is_file():
                out.append(f"{m.id}: {e.file} does not exist")
                continue
            count = path.read_text().count(e.original)
            if count != 1:
                out.append(f"{m.id}: the original occurs {count} times in {e.file}, not once: {e.original!r}")
            if e.original == e.replacement:
                out.append(f"{m.id}: the replacement is the original")
        for test in m.tests:
            file = test.split("::", 1)[0]
            if not (root / file).exists():
                out.append(f"{m.id}: test path {file} does not exist")
    return out


def _copy_tree(dest: pathlib.Path) -> None:
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        check=True,
        capture_output=True,
    ).stdout.split(b"\0")
    for name in filter(None, listed):
        src = ROOT / os.fsdecode(name)
        if not src.is_file():
            continue
        target = dest / os.fsdecode(name)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, target)


def _run(mutant: Mutant, tree: pathlib.Path, timeout: float) -> tuple[str, float, str]:
    """(``killed``, ``survived``, ``killed (timeout)`` or ``error (...)``, seconds, the test that
    failed or the last lines of the output). A run that errors without a failing test (the tests
    could not even be collected) is not a kill: the mutant was never tried."""
    saved = {e.file: (tree / e.file).read_text() for e in mutant.edits}
    try:
        for e in mutant.edits:
            path = tree / e.file
            text = path.read_text()
            assert text.count(e.original) == 1, (mutant.id, e.file)
            path.write_text(text.replace(e.original, e.replacement))
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join((str(tree), str(tree / "devtools"))),
            "PYTHONDONTWRITEBYTECODE": "1",
        }
        command = [sys.executable, "-m", "pytest", "-x", "-q", "--tb=line", "-p", "no:cacheprovider", *mutant.tests]
        started = time.monotonic()
        try:
            done = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return "killed (timeout)", time.monotonic() - started, ""
        elapsed = time.monotonic() - started
        lines = (done.stdout + done.stderr).strip().splitlines()
        if done.returncode == 0:
            return "survived", elapsed, "\n".join(lines[-3:])
        failed = [line for line in lines if line.startswith(("FAILED ", "ERROR "))]
        if done.returncode == 1 and failed:  # a test failed: the one that killed it, and where
            where = [line.replace(str(tree) + "/", "") for line in lines if line.startswith(str(tree))]
            return "killed", elapsed, "\n".join([failed[0], *where[:1]])[:400]
        return f"error (pytest exit {done.returncode})", elapsed, "\n".join(lines[-5:])
    finally:
        for file, text in saved.items():
            (tree / file).write_text(text)


def _check_copy(tree: pathlib.Path) -> None:
    """The tests must import the copy's ``drain_router``, not the checkout's (an editable install)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join((str(tree), str(tree / "devtools")))}
    where = subprocess.run(
        [sys.executable, "-c", "import drain_router; print(drain_router.__file__)"],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    if not pathlib.Path(where).resolve().is_relative_to(tree.resolve()):
        raise SystemExit(f"the copy's tests would import {where}, not the copy's drain_router package")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("ids", nargs="*", help="run only these mutants")
    parser.add_argument("--check", action="store_true", help="only check that every original matches once")
    parser.add_argument("--timeout", type=float, default=TIMEOUT_SECS, help="seconds per mutant's test run")
    args = parser.parse_args(argv)

    mutants = load()
    found = problems(mutants)
    if found:
        print("\n".join(found), file=sys.stderr)
        return 2
    if args.check:
        print(f"{len(mutants)} mutants, every original matches exactly once")
        return 0
    unknown = sorted(set(args.ids) - {m.id for m in mutants})
    if unknown:
        print(f"unknown mutant ids: {unknown}", file=sys.stderr)
        return 2
    selected = [m for m in mutants if not args.ids or m.id in args.ids]

    rows: list[tuple[str, str, float]] = []
    with tempfile.TemporaryDirectory(prefix="mutate-") as tmp:
        tree = pathlib.Path(tmp)
        _copy_tree(tree)
        _check_copy(tree)
        for i, m in enumerate(selected, 1):
            verdict, elapsed, tail = _run(m, tree, args.timeout)
            rows.append((m.id, verdict, elapsed))
            print(f"[{i}/{len(selected)}] {m.id}: {verdict} ({elapsed:.1f}s)", flush=True)
            if tail:
                print("    " + tail.replace("\n", "\n    "), flush=True)

    width = max(len(i) for i, _, _ in rows)
    print()
    print(f"{'mutant':<{width}}  {'verdict':<18}  seconds")
    for mutant_id, verdict, elapsed in rows:
        print(f"{mutant_id:<{width}}  {verdict:<18}  {elapsed:7.1f}")
    killed = sum(1 for _, v, _ in rows if v.startswith("killed"))
    survivors = [i for i, v, _ in rows if not v.startswith("killed")]
    print(f"\nkilled {killed}/{len(rows)}")
    if survivors:
        print(f"not killed: {', '.join(survivors)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
