"""Defaults that warn, and fractional queue timeouts, black-box: ``drain-router check`` as a
process (a clean environment, JSON on stdout, its exit status), as a CI gate or a reader runs it.

1. The README's by-hand router (``serve`` with the block's own flags): no advisory at all (its
   grace, 60, is declared above its 5 s drain; its health path is on with the default polling).
2. Admission control turned on with nothing else said: only the seed's DRAIN_CONSUMES_GRACE for the
   undeclared grace, and the queue timeout is the drain (30), not past it.
3. ``--queue-timeout-secs 1.5`` is taken and shown as 1.5 (from the flag and from its variable);
   ``-1``, ``abc`` and the rest are refused with exit 2 and one message naming the flag (or its
   variable), the value and the remedy.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from typing import Any

import pytest

from tests.cli.test_readme import README, by_hand_block

UPSTREAM = ["--upstream", "http://127.0.0.1:8000"]


def check(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("DRAIN_ROUTER_")} | (env or {})
    return subprocess.run(
        [sys.executable, "-m", "drain_router", "check", *args],
        env=clean,
        capture_output=True,
        text=True,
        timeout=60,
    )


def effective(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert done.returncode == 0, done.stderr
    data: dict[str, Any] = json.loads(done.stdout)
    return data


def readme_serve_args() -> list[str]:
    """The flags the README's by-hand block starts ``drain-router serve`` with."""
    block = by_hand_block(README.read_text()).replace("\\\n", " ")
    [line] = [line for line in block.splitlines() if line.lstrip().startswith("drain-router serve")]
    words = shlex.split(line, comments=True)
    words = words[: words.index("&")] if "&" in words else words
    assert words[:2] == ["drain-router", "serve"], words
    return words[2:]


def test_the_readme_by_hand_router_has_no_advisory() -> None:
    args = readme_serve_args()
    assert "--upstream-health-path" in args, "the block turns the health path on (what this guards)"
    data = effective(check(*args))
    assert data["advisories"] == []
    strict = check("--strict", *args)
    assert strict.returncode == 0, strict.stdout


def test_admission_with_its_defaults_adds_only_the_seeds_advisory() -> None:
    data = effective(check(*UPSTREAM, "--max-concurrent-requests", "4"))
    assert [a["code"] for a in data["advisories"]] == ["DRAIN_CONSUMES_GRACE"]
    assert data["advisories"][0]["grace_declared"] is False
    assert data["config"]["admission"]["queue_timeout_secs"] == 30 == data["config"]["drain"]["shutdown_drain_secs"]
    declared = check("--strict", *UPSTREAM, "--max-concurrent-requests", "4", "--termination-grace-secs", "60")
    assert declared.returncode == 0, declared.stdout


def test_an_explicit_timeout_past_the_drain_still_warns() -> None:
    done = check("--strict", *UPSTREAM, "--termination-grace-secs", "60", "--max-concurrent-requests", "4",
                 "--queue-timeout-secs", "30.5")  # fmt: skip
    assert done.returncode == 1
    [found] = json.loads(done.stdout)["advisories"]
    assert (found["code"], found["queue_timeout_secs"], found["shutdown_drain_secs"]) == (
        "QUEUE_TIMEOUT_EXCEEDS_DRAIN",
        30.5,
        30,
    )


@pytest.mark.parametrize(
    ("given", "shown"), [("1.5", 1.5), ("0.25", 0.25), ("2", 2)], ids=["one-and-a-half", "a-quarter", "whole"]
)
def test_a_fractional_queue_timeout_is_taken_and_shown_as_given(given: str, shown: float) -> None:
    flag = effective(check(*UPSTREAM, "--max-concurrent-requests", "4", "--queue-timeout-secs", given))
    variable = effective(check(*UPSTREAM, env={"DRAIN_ROUTER_QUEUE_TIMEOUT_SECS": given}))
    for data in (flag, variable):
        assert data["config"]["admission"]["queue_timeout_secs"] == shown
        assert f'"queue_timeout_secs": {given}' in json.dumps(data)
    assert [a["code"] for a in flag["advisories"]] == ["DRAIN_CONSUMES_GRACE"]


@pytest.mark.parametrize("value", ["-1", "abc", "0", "-0.5", "nan", "inf", "1e3", "1.5s"])
def test_a_bad_queue_timeout_exits_2_naming_the_flag_the_value_and_the_remedy(value: str) -> None:
    done = check(*UPSTREAM, "--queue-timeout-secs", value)
    assert done.returncode == 2
    assert done.stdout == ""
    [message] = [line for line in done.stderr.splitlines() if line.startswith("Error:")]
    assert "'--queue-timeout-secs'" in message
    assert repr(value) in message
    assert "more than 0" in message and "e.g. 30 or 1.5" in message, "the remedy"


def test_a_bad_variable_is_named_by_the_variable() -> None:
    done = check(*UPSTREAM, env={"DRAIN_ROUTER_QUEUE_TIMEOUT_SECS": "abc"})
    assert done.returncode == 2
    assert "DRAIN_ROUTER_QUEUE_TIMEOUT_SECS" in done.stderr and "'abc'" in done.stderr
