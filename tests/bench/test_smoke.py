"""The bench harness cannot rot: a seconds-long run of every workload against every target that is
installed here (direct and the router always), with no performance assertion."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench import report, stats, targets

ROOT = Path(__file__).resolve().parents[2]
ALWAYS = {"direct", "router"}


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_smoke_run_measures_every_workload_on_every_installed_target(tmp_path: Path) -> None:
    """1. `python -m bench --smoke` against all targets 2. read its results file.
    Result: direct and the router have every workload, with no failed or skipped cell; the router drained its
    streams losslessly and exited 0; a target whose binary is absent is reported, not fatal."""
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "--smoke", "--results", str(tmp_path), "--no-docs"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=140,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    files = list(tmp_path.glob("*-smoke.json"))
    assert len(files) == 1
    results = json.loads(files[0].read_text())

    installed = {t.name for t in targets.all_targets() if t.name in targets.DEFAULT_TARGETS and t.missing() is None}
    assert installed >= ALWAYS, "direct and the router must always run"
    for name, info in results["targets"].items():
        assert info["available"] == (name in installed), (name, info)

    cells = {(r["workload"], r["target"]): r["metrics"] for r in results["records"]}
    for workload in ("small_get", "sse_burst", "sse_paced_4", "upload_1mib"):
        for name in installed:
            metrics = cells[(workload, name)]
            assert "failed" not in metrics, (workload, name, metrics)
            assert metrics.get("errors", 0) == 0, (workload, name, metrics)
    for name in installed - {"direct"}:
        assert cells[("idle_hold", name)]["steps"][0]["held"] == 20, name
    ws_installed = installed & set(targets.WS_TARGETS)
    for name in ws_installed:
        echo = cells[("ws_echo", name)]
        assert "skipped" not in echo, (name, echo)
        assert "failed" not in echo and echo["errors"] == 0 and echo["messages_total"] > 0, (name, echo)
        if name != "direct":
            assert cells[("ws_idle_hold", name)]["sessions_open"] == 20, name
    assert {t for w, t in cells if w.startswith("ws_")} <= ws_installed
    drain = cells[("drain", "router")]
    assert drain["streams_complete"] == drain["streams"], drain
    assert drain["exit_code"] == 0 and drain["readyz_503_ms"] is not None, drain

    derived = results["derived"]
    assert {g["goal"].split(" (")[0] for g in derived["goals"]} >= {"/readyz 503 after SIGTERM"}
    assert "| workload |" in proc.stdout  # the generated table
    assert list(tmp_path.glob("*-smoke.png")) or "chart skipped" in proc.stderr


def test_percentiles_are_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    got = stats.percentiles(values)
    assert (got["p50"], got["p99"], got["max"]) == (50.0, 99.0, 100.0)
    assert stats.summary([3.0, 1.0, 2.0]) == {"median": 2.0, "min": 1.0, "max": 3.0, "n": 3, "spread": 1.0}
    assert stats.summary([None])["median"] is None


def test_table_goes_between_the_markers_only(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{report.BEGIN}\nold table\n{report.END}\noutro\n")
    assert report.inject(readme, "| new |\n")
    assert readme.read_text() == f"intro\n{report.BEGIN}\n| new |\n{report.END}\noutro\n"
    plain = tmp_path / "plain.md"
    plain.write_text("no markers\n")
    assert not report.inject(plain, "| new |\n")
    assert plain.read_text() == "no markers\n"


def test_the_table_is_published_into_the_docs_page_only(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """1. publish the committed full run into a copy of docs/bench.md 2. look at the README.
    Result: the table lands between the page's markers; the README carries no bench markers, so the
    generator writes one page, the one that holds the table."""
    from bench import __main__ as cli

    results_path = report.latest(ROOT / "bench" / "results")
    assert results_path is not None
    page = tmp_path / "bench.md"
    page.write_text((ROOT / "docs" / "bench.md").read_text())
    cli.publish(json.loads(results_path.read_text()), results_path, docs=page, chart_path=None)
    text = page.read_text()
    assert text.count(report.BEGIN) == text.count(report.END) == 1
    table = capsys.readouterr().out.removesuffix("\n")  # print() added the newline
    assert "| workload |" in table
    assert f"{report.BEGIN}\n{table}{report.END}" in text
    readme = (ROOT / "README.md").read_text()
    assert report.BEGIN not in readme and report.END not in readme
