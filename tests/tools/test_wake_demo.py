"""``drain-router-dev demo --wake``, shortened: the stand-in Kubernetes API, a real activator process,
a pod (fake-model behind drain-router serve) started by the demo once the wake is asked."""

from __future__ import annotations

import io

import pytest
from click.testing import CliRunner

from drain_router_dev import demo, wake_demo

ROWS = [
    "clients",
    "requests held (peak)",
    "wake asked at",
    "pod ready at (cold start 0.5 s)",
    "first answer at",
    "last answer at",
    "answered whole",
    "lost",
    "activations (activator)",
    "activation seconds (activator)",
]


@pytest.mark.timeout(60)
async def test_the_held_requests_are_answered_once_the_woken_pod_is_ready() -> None:
    """1. five clients stream through the activator for a service asleep: all five held, a wake
    asked  2. a 0.5 s cold start, the pod started and listed  3. every stream answered whole, after
    the pod was ready; one activation. Result: exit 0 and the table's every row."""
    out = io.StringIO()
    assert await wake_demo.run(out, clients=5, cold_start_secs=0.5) == 0, out.getvalue()
    lines = out.getvalue().split("\n\n")[1].splitlines()
    assert [line.split("  ")[0] for line in lines] == ROWS
    values = {line.split("  ")[0]: line.split("  ")[-1].strip() for line in lines}
    assert values["requests held (peak)"] == "5" and values["answered whole"] == "5" and values["lost"] == "0"
    assert values["activations (activator)"] == "1"
    seconds = [float(values[row].removesuffix(" s")) for row in ROWS[2:6]]
    assert seconds == sorted(seconds), "wake asked, pod ready, first answer, last answer: in that order"
    assert seconds[1] - seconds[0] >= 0.5, "the pod was ready only after its cold start"


def test_a_lost_request_is_in_the_table() -> None:
    wake = wake_demo.Wake(
        clients=3,
        cold_start_secs=3,
        held_peak=3,
        wake_asked_at=0.01,
        pod_ready_at=None,
        first_answer_at=None,
        last_answer_at=60.0,
        answered=0,
        lost=3,
        activations=0,
        activation_secs=None,
    )
    text = wake_demo.table(wake)
    assert "lost                            3" in text and "pod ready at (cold start 3 s)   -" in text


def test_demo_help_names_the_wake_view() -> None:
    result = CliRunner().invoke(demo.command, ["--help"])
    assert result.exit_code == 0 and "--wake" in result.output and "--cold-start-secs" in result.output
