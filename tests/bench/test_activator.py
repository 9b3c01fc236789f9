"""The activator workload: its smallest run measures both arms (relayed and held, nothing lost), and
its ratios, goals and table from records."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench import activator_report, report

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(100)
def test_the_smoke_run_relays_holds_and_releases_on_both_arms(tmp_path: Path) -> None:
    """1. `python -m bench --smoke --workloads activator` 2. read its results file.
    Result: per arm (router, activator), small GETs relayed with no error and a CPU figure; 20
    requests held (the process's own gauge said so), all 20 answered 200 once released, with an RSS
    figure; the two goals evaluated; the table printed."""
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "--smoke", "--workloads", "activator", "--results", str(tmp_path), "--no-docs"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (path,) = tmp_path.glob("*-smoke.json")
    results = json.loads(path.read_text())
    cells = {(r["workload"], r["target"]): r["metrics"] for r in results["records"]}
    assert set(cells) == {(w, t) for w in ("activator_small_get", "activator_held") for t in ("router", "activator")}
    for arm in ("router", "activator"):
        relayed = cells[("activator_small_get", arm)]
        assert "failed" not in relayed and relayed["errors"] == 0 and relayed["requests"] > 0, (arm, relayed)
        assert relayed["target_cpu_us_per_unit"] > 0, (arm, relayed)
        held = cells[("activator_held", arm)]
        assert "failed" not in held, (arm, held)
        assert (held["held"], held["released"], held["errors"]) == (20, 20, 0), (arm, held)
        assert held["rss_held_kib"] >= held["rss_base_kib"] > 0, (arm, held)
    goals = [g for g in results["derived"]["goals"] if g["goal"].startswith("activator ")]
    assert [g["threshold"] for g in goals] == [1.25, 2.0]
    assert goals[0]["measured"] is not None
    assert "| relayed small GET: CPU per request |" in proc.stdout


def _records(cpu: dict[str, list[float]], kib: dict[str, list[float]]) -> list[dict[str, Any]]:
    out = []
    for arm in ("router", "activator"):
        for rnd, (c, k) in enumerate(zip(cpu[arm], kib[arm], strict=True)):
            small = {"target_cpu_us_per_unit": c, "rate": 1000.0, "requests": 3000}
            held = {"kib_per_held": k, "cpu_us_per_held": 5.0, "cpu_us_per_released": 40.0, "held": 1000}
            out.append({"round": rnd, "workload": "activator_small_get", "target": arm, "metrics": small})
            out.append({"round": rnd, "workload": "activator_held", "target": arm, "metrics": held | {"errors": 0}})
    return out


def test_ratios_goals_and_table() -> None:
    """The activator over the router in each round, then the median; a goal met and one missed;
    the records are the activator group's, not small GET's."""
    records = _records(
        {"router": [20.0, 40.0, 30.0], "activator": [24.0, 52.0, 36.0]},
        {"router": [10.0, 10.0, 12.0], "activator": [25.0, 22.0, 30.0]},
    )
    got = activator_report.ratio(records, "activator_small_get", "target_cpu_us_per_unit")
    assert (got["median"], got["min"], got["max"]) == pytest.approx((1.2, 1.2, 1.3))
    goals = activator_report.goals(records)
    assert [(g["threshold"], g["met"]) for g in goals] == [(1.25, True), (2.0, False)]
    assert goals[1]["measured"] == pytest.approx(2.5)
    text = activator_report.markdown(records, {"small_connections": 64, "activator_held": 1000})
    assert (
        "| relayed small GET: CPU per request | 30.0 µs (20.0–40.0) | 36.0 µs (24.0–52.0) | 1.20x (1.20–1.30) |" in text
    )
    assert "| RSS per held request | 10.0 KiB (10.0–12.0) | 25.0 KiB (22.0–30.0) | 2.50x (2.20–2.50) |" in text
    assert "--queue-size 1000`" in text and "not answered 200 after the release: 0." in text
    assert report._group("activator_held") == "activator" and report._family("activator_small_get") == "activator"
    results = {"records": records, "plan": {"small_connections": 64, "hold_steps": [20]}}
    assert [g["goal"] for g in report.goals(results, {"ratios": {}, "summary": {}})] == [g["goal"] for g in goals]
    assert activator_report.goals([{"round": 0, "workload": "small_get", "target": "router", "metrics": {}}]) == []


def test_a_failed_cell_is_named_in_the_goal_and_the_table() -> None:
    records = _records({"router": [20.0], "activator": [22.0]}, {"router": [10.0], "activator": [12.0]})
    records = [r for r in records if not (r["workload"] == "activator_held" and r["target"] == "activator")]
    records.append({"round": 0, "workload": "activator_held", "target": "activator", "metrics": {"failed": "boom"}})
    goals = activator_report.goals(records)
    assert goals[1]["measured"] is None and goals[1]["note"] == "boom"
    assert "Failed cells: activator: boom." in activator_report.markdown(records, {"activator_held": 1000})
