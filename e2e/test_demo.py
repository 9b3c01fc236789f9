"""``drain-router-dev demo`` runs from a clean working directory and tells the story it promises."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

DEMO_ARGS = [
    "--clients",
    "8",
    "--drain-secs",
    "1",
    "--probe-interval-ms",
    "200",
    "--probe-fall",
    "2",
    "--chunks",
    "10",
    "--interval-ms",
    "30",
]


def _table_row(output: str, name: str) -> list[str]:
    line = next(line for line in output.splitlines() if line.startswith(name))
    return re.split(r"\s{2,}", line.strip())[1:]


@pytest.mark.timeout(150)
def test_demo_compares_three_recipes(tmp_path: Path, report: list[str]) -> None:
    """1. run the demo (plain output, a PNG) in an empty directory. Result: exit 0, drain-router lost
    nothing (requests, gRPC calls); no drain lost requests and gRPC calls, and so did the sleep recipe behind a balancer that probes only
    the engine, and the summary says drain-router lost fewer than each; the sleep recipe's figures
    (with either balancer) are in the same table; the PNG when matplotlib is there."""
    png = tmp_path / "timeline.png"
    proc = subprocess.run(
        [sys.executable, "-m", "drain_router_dev", "demo", "--plain", "--png", str(png), *DEMO_ARGS],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=140,
        stdin=subprocess.DEVNULL,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    requests = [int(x) for x in _table_row(proc.stdout, "requests")]
    lost = [int(x) for x in _table_row(proc.stdout, "lost")]
    assert len(requests) == len(lost) == 4, output
    report.append(
        f"demo: drain-router {lost[0]} lost of {requests[0]}, sleep + engine drain {lost[1]} of {requests[1]}, "
        f"sleep (probe-only LB) {lost[2]} of {requests[2]}, no drain {lost[3]} of {requests[3]}"
    )
    assert lost[0] == 0 and lost[2] > 0 and lost[3] > 0, output
    for label, n in (("sleep (probe-only LB)", lost[2]), ("no drain", lost[3])):
        assert f"drain-router lost fewer requests than {label}: 0 against {n}." in proc.stdout, output
    for row in ("p50 completion", "p99 completion", "SIGTERM to exit"):
        assert [cell.endswith(" s") for cell in _table_row(proc.stdout, row)] == [True] * 4, output
    # Realtime sessions beside the streams, none cut under drain-router.
    assert int(_table_row(proc.stdout, "realtime sessions")[0]) > 0, output
    assert _table_row(proc.stdout, "sessions cut")[0] == "0", output
    # Without the drain nothing tells a session to go: the ones open at the SIGKILL are cut (1006).
    assert int(_table_row(proc.stdout, "sessions cut")[3]) > 0, output
    # gRPC calls through the balancer's gRPC side beside them: none lost under drain-router; no drain
    # loses some (the balancer still sends to a pod whose listener closed), so the demo can show it.
    calls = [int(x) for x in _table_row(proc.stdout, "gRPC calls")]
    calls_lost = [int(x) for x in _table_row(proc.stdout, "gRPC calls lost")]
    report.append(f"demo gRPC: drain-router {calls_lost[0]} lost of {calls[0]}, no drain {calls_lost[3]} of {calls[3]}")
    assert calls[0] > 0 and calls_lost[0] == 0 and calls_lost[3] > 0, output
    assert f"drain-router lost fewer gRPC calls than no drain: 0 against {calls_lost[3]}." in proc.stdout, output
    assert "SIGTERM pod-0" in proc.stdout and "balancer: pod-0 out of rotation" in proc.stdout
    assert "pod deleted: preStop sleep pod-0" in proc.stdout
    if importlib.util.find_spec("matplotlib") is not None:
        assert png.read_bytes().startswith(b"\x89PNG"), output
    else:
        assert "No PNG timeline" in proc.stdout and not png.exists()
