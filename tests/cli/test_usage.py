"""What a user reads: help, usage and configuration errors of a real ``python -m drain_router``
process (exit code, stdout and stderr), with no ``DRAIN_ROUTER_*`` variable inherited."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import click
import pytest

from drain_router import cli
from drain_router.config import usage

UPSTREAM = ["--upstream", "http://127.0.0.1:8000"]


def drain_router(
    *args: str, env: dict[str, str] | None = None, code: str | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m drain_router ARGS`` (or ``python -c CODE ARGS``) with only ``env`` as its
    ``DRAIN_ROUTER_*`` variables."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("DRAIN_ROUTER_")}
    entry = ["-c", code] if code is not None else ["-m", "drain_router"]
    return subprocess.run(
        [sys.executable, *entry, *args],
        env={**clean, **(env or {}), "COLUMNS": "100"},
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )


def words(text: str) -> str:
    return " ".join(text.split())


def first_paragraph(help_text: str) -> str:
    """The paragraph under ``Usage:`` in a command's own help."""
    return words(help_text.split("\n\n")[1])


@pytest.mark.parametrize("name", ["controller", "activator"])
def test_top_level_help_describes_a_lazy_command_as_its_own_help_does(name: str) -> None:
    """``drain-router --help`` lists the lazy commands without importing them, so their lines are
    written twice; they must say what each command's own help says (the demo's said "with and
    without the drain" while it ran three recipes)."""
    own = drain_router(name, "--help")
    assert own.returncode == 0, own.stderr
    top = drain_router("--help")
    assert top.returncode == 0, top.stderr
    assert words(f"{name} {first_paragraph(own.stdout)}") in words(top.stdout)


@pytest.mark.parametrize(
    ("given", "missing"),
    [
        (["--readiness-probe-period-secs", "5"], "--readiness-probe-failure-threshold"),
        (["--readiness-probe-failure-threshold", "3"], "--readiness-probe-period-secs"),
    ],
)
@pytest.mark.parametrize("command", ["serve", "check"])
def test_half_a_probe_pair_names_the_flag_given_its_value_and_the_one_missing(
    command: str, given: list[str], missing: str
) -> None:
    """A probe period without its threshold (or the reverse) is refused, exit 2, naming the flag
    that was given with its value and the one to add; the message printed ``None`` as the value."""
    result = drain_router(command, *UPSTREAM, *given)
    assert result.returncode == 2, result.stderr
    flag, value = given
    assert f"Invalid value for '{flag}': '{value}': declare {missing} with it" in words(result.stderr)
    assert "None" not in result.stderr
    assert result.stdout == ""


@pytest.mark.parametrize(
    ("variable", "value", "says"),
    [
        ("DRAIN_ROUTER_SHUTDOWN_DRAIN_SECS", "abc", "must be a whole number of seconds"),
        ("DRAIN_ROUTER_TERMINATION_GRACE_SECS", "0", "must be at least 1 second"),
        ("DRAIN_ROUTER_ADMIN_PORT", "8080", "must differ from --port (8080)"),
        ("DRAIN_ROUTER_READINESS_PROBE_PERIOD_SECS", "5", "declare --readiness-probe-failure-threshold"),
    ],
)
def test_a_bad_environment_variable_is_named_by_the_variable(variable: str, value: str, says: str) -> None:
    """A value from ``DRAIN_ROUTER_*`` is refused naming that variable, the one to change (the
    message named only the flag, which the user never typed), then its flag, value and remedy."""
    flag = "--" + variable.removeprefix("DRAIN_ROUTER_").lower().replace("_", "-")
    result = drain_router("serve", *UPSTREAM, env={variable: value})
    assert result.returncode == 2, result.stderr
    text = words(result.stderr)
    assert f"Invalid value for '{variable}' (the variable of '{flag}'): '{value}': {says}" in text


def test_a_bad_upstream_variable_is_named_by_the_variable() -> None:
    result = drain_router("serve", env={"DRAIN_ROUTER_UPSTREAM": "localhost:8000"})
    assert result.returncode == 2, result.stderr
    assert "Invalid value for 'DRAIN_ROUTER_UPSTREAM' (the variable of '--upstream'): 'localhost:8000'" in result.stderr


def test_a_bad_flag_is_named_by_the_flag_even_with_the_variable_set() -> None:
    """The flag wins over the variable, so the error names the flag alone."""
    result = drain_router(
        "check", *UPSTREAM, "--shutdown-drain-secs", "abc", env={"DRAIN_ROUTER_SHUTDOWN_DRAIN_SECS": "5"}
    )
    assert result.returncode == 2, result.stderr
    assert "Invalid value for '--shutdown-drain-secs': 'abc'" in result.stderr
    assert "DRAIN_ROUTER_SHUTDOWN_DRAIN_SECS" not in result.stderr


@pytest.mark.parametrize("grace", [[], ["--termination-grace-secs", "36000"]])
def test_a_drain_past_the_ceiling_is_refused_without_suggesting_a_grace(grace: list[str]) -> None:
    """18000 (an extra digit) is refused, exit 2, with or without a grace to match; the message
    says the 1800 ceiling holds whatever the grace is (it suggested declaring a grace, which
    changes nothing)."""
    result = drain_router("serve", *UPSTREAM, "--shutdown-drain-secs", "18000", *grace)
    assert result.returncode == 2, result.stderr
    text = words(result.stderr)
    assert "Invalid value for '--shutdown-drain-secs': '18000': must be at most 1800, whatever" in text
    assert "declare --termination-grace-secs" not in text


@pytest.mark.parametrize("command", ["serve", "check"])
def test_help_lists_the_flags_needed_first_first_then_by_section(command: str) -> None:
    """``--upstream``, ``--shutdown-drain-secs`` and ``--termination-grace-secs`` come first, under
    their own heading (they were 1st, 11th and 12th); the rest follow under one heading per
    section, the drain's probe settings next; every flag is listed once."""
    result = drain_router(command, "--help")
    assert result.returncode == 0, result.stderr
    flags = re.findall(r"^  (--[a-z-]+)", result.stdout, flags=re.MULTILINE)
    headings = re.findall(r"^(\S[^\n]*):$", result.stdout, flags=re.MULTILINE)
    assert flags[:3] == ["--upstream", "--shutdown-drain-secs", "--termination-grace-secs"], flags
    assert flags[3:5] == ["--readiness-probe-period-secs", "--readiness-probe-failure-threshold"], flags
    assert len(flags) == len(set(flags)) and {"--port", "--admin-port", "--log-level"} <= set(flags), flags
    assert headings == [
        "Set these first",
        "Drain",
        "Traffic listener and model server",
        "gRPC listener (h2c)",
        "Admission control",
        "Admin listener",
        "Model server health",
        "Logging",
        "Other options",
    ], result.stdout
    first_section = result.stdout.split("Set these first:\n", 1)[1].split("\n\n", 1)[0]
    assert re.findall(r"^  (--[a-z-]+)", first_section, flags=re.MULTILINE) == flags[:3]


def _every_command() -> list[tuple[str, click.Command, click.Context]]:
    """Every command of ``drain-router`` (the group, then each subcommand, the lazy ones imported),
    with a context to render its options in."""
    top = click.Context(cli.main, info_name="drain-router")
    found = [("drain-router", cli.main, top)]
    for name in cli.main.list_commands(top):
        command = cli.main.get_command(top, name)
        assert command is not None, name
        found.append((name, command, click.Context(command, parent=top, info_name=name)))
    return found


def test_every_option_of_every_command_has_help_and_says_what_its_value_is() -> None:
    """Each option of each command (the controller, the demo and the fake model included) has help
    text, and an option that takes a value names it as serve's do (PORT, SECS, N, a choice), not by
    click's type (INTEGER RANGE, FLOAT RANGE, TEXT): the controller showed INTEGER RANGE for its
    ports and --log-level had no help."""
    bad = []
    for name, command, ctx in _every_command():
        for param in command.get_params(ctx):
            if not isinstance(param, click.Option) or param.hidden:
                continue
            flag = f"{name} {param.opts[0]}"
            if not (param.help or "").strip():
                bad.append(f"{flag}: no help")
            if not (param.is_flag or param.count) and param.make_metavar(ctx) in usage.GENERIC_METAVARS:
                bad.append(f"{flag}: metavar {param.make_metavar(ctx)}")
    assert not bad, "\n".join(bad)


def test_controller_help_lists_its_options_under_headings_as_serve_does() -> None:
    """``controller --help`` has headings, as ``serve --help`` has (it had one "Options" list), its
    logging flags under serve's "Logging" heading and --help under "Other options", last; its ports
    and durations read PORT and SECS."""
    result = drain_router("controller", "--help")
    assert result.returncode == 0, result.stderr
    headings = re.findall(r"^(\S[^\n]*):$", result.stdout, flags=re.MULTILINE)
    assert headings == [
        "What to watch",
        "Metrics and liveness",
        "Staged deletion",
        "Scale to zero and wake on a request",
        "Leader election",
        "Logging",
        "Other options",
    ], result.stdout
    logging_section = result.stdout.split("Logging:\n", 1)[1].split("\n\n", 1)[0]
    assert re.findall(r"^  (--[a-z-]+)", logging_section, flags=re.MULTILINE) == ["--log-format", "--log-level"]
    text = words(result.stdout)
    assert "--metrics-port PORT" in text and "--liveness-port PORT" in text and "--requeue-secs SECS" in text
    assert "--activator-service NS/NAME" in text and "--activator-service NS/NAME:" not in text
    assert "--activator-ports FIRST-LAST" in text and "default: 20000-20999" in text
    assert "--activator-admin-port PORT" in text and "default: 9091" in text
    assert "RANGE" not in text and "INTEGER" not in text and "FLOAT" not in text
