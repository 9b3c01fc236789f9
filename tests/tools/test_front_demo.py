"""``drain-router-dev demo --front``, shortened to three clients: two pods (fake-model behind a real
drain-router serve each) and a real drain-router front; pod-0 rolled under the clients straight to
its router, then under the same clients through the front."""

from __future__ import annotations

import io
import re

import pytest
from click.testing import CliRunner

from drain_router_dev import demo, front_demo
from drain_router_dev.front_demo import Run, Stream, Token

ROWS = [
    "streams",
    "completed (finish_reason, [DONE])",
    "lost",
    'continued (front: outcome="continued")',
    "gap at the join p50 / max",
    "longest gap between tokens (50 ms a token)",
    "answer = t0 ... t59 uninterrupted",
]


def _rows(table: str) -> dict[str, list[str]]:
    """The table's rows by label: its cells, split at two spaces or more."""
    lines = table.splitlines()[2:]
    return {cells[0]: cells[1:] for cells in (re.split(r"\s{2,}", line) for line in lines)}


@pytest.mark.timeout(60)
async def test_the_roll_cuts_every_stream_straight_and_the_front_continues_each() -> None:
    """1. three clients straight to pod-0's router, SIGTERMed mid-stream: its deadline ends each stream
    with the error event  2. the same clients through the front, pod-0 rolled the same way once the
    front sees pod-1 ready. Result: exit 0; straight, 3 lost and no answer whole; through the front
    none lost, each stream continued on pod-1 (the front's counter says 3) and each answer the
    uninterrupted sequence, the join marked in each client's line."""
    out = io.StringIO()
    assert await front_demo.run(out, clients=3) == 0, out.getvalue()
    text = out.getvalue()
    table = text.split("\n\n")[-2]
    rows = _rows(table)
    assert list(rows) == ROWS, table
    assert table.splitlines()[0].split("  ")[-2:] == ["straight to pod-0", "through the front"]
    assert rows["streams"] == ["3", "3"]
    assert rows["completed (finish_reason, [DONE])"] == ["0", "3"]
    assert rows["lost"] == ["3", "0"]
    assert rows['continued (front: outcome="continued")'] == ["-", "3"]
    assert rows["answer = t0 ... t59 uninterrupted"] == ["0 of 3", "3 of 3"]
    assert rows["gap at the join p50 / max"][0] == "-" and rows["gap at the join p50 / max"][1].endswith(" ms")
    control, through = text.split("== through the front")
    assert control.count("<cut: drain_deadline>  lost (") == 3, control
    assert through.count("<cut; pod-1 joins after ") == 3, through
    assert through.count("[length] [DONE]: the uninterrupted answer") == 3, through


def _stream(client: int, texts: list[str], *, seqs: list[int], ats: list[float], **end: object) -> Stream:
    stream = Stream(client, status=200, ended=True)
    stream.tokens = [Token(at, f" {word}", seq) for word, seq, at in zip(texts, seqs, ats, strict=True)]
    for name, value in end.items():
        setattr(stream, name, value)
    return stream


def test_a_line_marks_the_join_and_says_whether_the_answer_is_whole() -> None:
    """Six tokens, the continuation numbered from 0 again at t3, 120 ms after t2."""
    words = [f"t{k}" for k in range(6)]
    ats = [0.0, 0.05, 0.1, 0.22, 0.27, 0.32]
    joined = _stream(1, words, seqs=[0, 1, 2, 0, 1, 2], ats=ats, done=True, finish_reason="length")
    assert front_demo.joins(joined) == [3]
    assert front_demo.line(joined, 6, other="pod-1") == (
        "client 1  t0 t1 t2  <cut; pod-1 joins after 120 ms>  t3 t4 t5  [length] [DONE]: the uninterrupted answer"
    )
    assert front_demo.line(joined, 7, other="pod-1").endswith("NOT the uninterrupted answer")
    cut = _stream(2, words[:3], seqs=[0, 1, 2], ats=ats[:3], error="drain_deadline")
    assert (
        front_demo.line(cut, 6, other="")
        == "client 2  t0 t1 t2  <cut: drain_deadline>  lost (3 of 6 tokens, no [DONE])"
    )


def test_the_table_counts_a_lost_stream_and_the_gaps_at_the_joins() -> None:
    ats = [0.0, 0.05, 0.1, 0.22]
    joined = _stream(1, ["t0", "t1", "t2", "t3"], seqs=[0, 1, 2, 0], ats=ats, done=True, finish_reason="length")
    cut = _stream(2, ["t0", "t1"], seqs=[0, 1], ats=ats[:2], error="drain_deadline")
    runs = [
        Run(label="a", streams=(cut,), tokens=4, continued=None),
        Run(label="b", streams=(joined,), tokens=4, continued=1),
    ]
    rows = _rows(front_demo.table(runs))
    assert rows["lost"] == ["1", "0"] and rows["completed (finish_reason, [DONE])"] == ["0", "1"]
    assert rows["gap at the join p50 / max"] == ["-", "120 / 120 ms"]
    assert rows["answer = t0 ... t3 uninterrupted"] == ["0 of 1", "1 of 1"]


def test_demo_help_names_the_front_view() -> None:
    result = CliRunner().invoke(demo.command, ["--help"])
    assert result.exit_code == 0 and "--front" in result.output
