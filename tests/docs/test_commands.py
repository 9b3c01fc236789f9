"""Every command in README.md and docs/*.md, run as written, or said why not.

The table (:data:`tests.docs.commands.TABLE`) decides for each command: run here in a temp dir with
the venv on PATH, rendered by `helm template` with the same flags and values (every `helm install`
and `helm upgrade`; the cluster test installs them for real), run on the cluster, or skipped with the
reason. A command in no row fails: a new command in the docs needs a row.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import yaml

from drain_router_dev import process
from tests.chart.helm import CONTROLLER_CHART, obtain_helm
from tests.docs.commands import REPO, TABLE, Command, How, Row, all_commands, commands_in_text, rows_for
from tests.docs.reader import reader_dir

COMMANDS = all_commands()
VENV_BIN = Path(sys.executable).parent
BY_HAND = re.compile(r"<!-- by-hand:begin -->(.*?)<!-- by-hand:end -->", re.S)


def _row(command: Command) -> Row:
    rows = rows_for(command)
    assert len(rows) == 1, f"{command}\n  is in {len(rows)} rows of the table; a new command in the docs needs a row"
    return rows[0]


def _ids(how: How) -> list[Command]:
    return [c for c in COMMANDS if len(rows_for(c)) == 1 and rows_for(c)[0].how is how]


def test_every_command_has_exactly_one_row() -> None:
    missing = [str(c) for c in COMMANDS if len(rows_for(c)) != 1]
    assert missing == [], "a new command in the docs needs a row (one only):\n" + "\n".join(missing)


def test_every_row_names_a_command() -> None:
    stale = [f"{r.file}: {r.snippet}" for r in TABLE if not any(r.matches(c) for c in COMMANDS)]
    assert stale == [], "rows whose command left the docs:\n" + "\n".join(stale)


def test_skips_say_why() -> None:
    assert [r for r in TABLE if r.how in (How.SKIP, How.MAKE) and not r.reason] == []


def test_the_extraction_reads_blocks_as_a_reader_does() -> None:
    text = (
        "```sh\nhelm install a charts/x -n m \\\n  --set b=c   # note\n# comment\n\nmake demo\n```\n"
        "```yaml\nhelm: not a command\n```\n"
        "```console\n$ drain-router serve --x 1\nError: bad\n  wrapped\n\n$ echo \\\n    two\n```\n"
        "```\nGateway --> router\n```\n"
        "  ```\n  pip install x\n  drain-router controller\n  ```\n"
    )
    found = [(c.line, c.text, c.output) for c in commands_in_text(text, "f.md")]
    assert found == [
        (2, "helm install a charts/x -n m --set b=c   # note", ""),
        (6, "make demo", ""),
        (12, "drain-router serve --x 1", "Error: bad\n  wrapped"),
        (16, "echo two", ""),
        (23, "pip install x", ""),
        (24, "drain-router controller", ""),
    ]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DRAIN_ROUTER_", "OTEL_", "KUBECONFIG"))}
    return env | {"PATH": f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"} | extra


def _squash(text: str) -> str:
    return " ".join(text.split())


@pytest.mark.parametrize("command", _ids(How.RUN), ids=str)
async def test_runs_as_written(command: Command, tmp_path: Path) -> None:
    row = _row(command)
    if command.text.startswith("OTEL_") and "drain-router serve" in command.text:
        await _serve_until_live_then_term(command, tmp_path)
        return
    cwd = REPO if row.cwd == "repo" else tmp_path
    done = subprocess.run(["bash", "-c", command.text], cwd=cwd, env=_env(), capture_output=True, text=True, timeout=50)
    assert done.returncode == row.exit_code, (
        f"{command}\nstdout:\n{done.stdout[-2000:]}\nstderr:\n{done.stderr[-2000:]}"
    )
    if command.output:
        assert _squash(command.output) in _squash(done.stdout + done.stderr), (
            f"{command}: the documented output is not what it prints:\n{done.stderr}"
        )
    if "--print-crd > modelservice.yaml" in command.text:
        shipped = (CONTROLLER_CHART / "crds" / "modelservice.yaml").read_text()
        assert (tmp_path / "modelservice.yaml").read_text() == shipped, "--print-crd is not the CRD the chart ships"


async def _serve_until_live_then_term(command: Command, tmp_path: Path) -> None:
    """A router started as written, its ports moved to free ones by its environment (never 8080 or
    9091 of another process) and no drain window, until its admin port answers /livez (the
    OpenTelemetry SDK loaded, the exporter pointed at a collector that does not resolve); then
    SIGTERM: exit 0."""
    admin = process.free_port()
    env = _env(
        DRAIN_ROUTER_PORT=str(process.free_port()),
        DRAIN_ROUTER_ADMIN_PORT=str(admin),
        DRAIN_ROUTER_SHUTDOWN_DRAIN_SECS="0",
    )
    log_path = tmp_path / "router.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            ["bash", "-c", command.text],
            cwd=tmp_path,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:

        def live() -> bool:
            assert proc.poll() is None, f"exited {proc.returncode}: {log_path.read_text()[-3000:]}"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{admin}/livez", timeout=1) as answer:
                    return bool(answer.status == 200)
            except OSError:
                return False

        await process.wait_until(live, 20, "the router's /livez")
        os.killpg(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=20) == 0, log_path.read_text()[-3000:]
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


@pytest.mark.parametrize("command", _ids(How.BY_HAND), ids=str)
def test_by_hand_commands_are_in_the_block_the_readme_test_runs(command: Command) -> None:
    readme = (REPO / "README.md").read_text()
    block = BY_HAND.search(readme)
    assert block, "README.md has no by-hand block"
    first, last = readme.count("\n", 0, block.start()) + 1, readme.count("\n", 0, block.end()) + 1
    assert first < command.line < last, f"{command} left the by-hand block (lines {first}-{last})"
    assert (REPO / "tests" / "cli" / "test_readme.py").is_file()


@pytest.mark.parametrize("command", _ids(How.MAKE), ids=str)
def test_make_targets_resolve(command: Command) -> None:
    words = shlex.split(command.text, comments=True)
    words = words[1:] if words[0] == "sudo" else words
    assert words[0] == "make"
    done = subprocess.run(["make", "-n", *words[1:]], cwd=REPO, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, f"{command}: {done.stderr[-1500:]}"


@pytest.fixture(scope="module")
def helm_binary() -> Path:
    try:
        return obtain_helm()
    except (OSError, RuntimeError, subprocess.TimeoutExpired) as exc:
        if os.environ.get("CHART_TEST_REQUIRE_HELM") == "1":
            pytest.fail(f"helm is required but could not be obtained: {exc}")
        pytest.skip(f"helm could not be obtained: {exc}")


def as_template(text: str) -> list[str]:
    """`helm install|upgrade [--install] NAME CHART ...` as the `helm template` of the same release,
    chart, namespace, flags and values (what renders is what installs)."""
    words = shlex.split(text, comments=True)
    assert words[0] == "helm" and words[1] in ("install", "upgrade"), text
    rest = [w for w in words[2:] if w != "--install"]
    return ["template", *rest]


@pytest.mark.parametrize("command", _ids(How.HELM), ids=str)
def test_helm_commands_render_as_written(command: Command, helm_binary: Path, tmp_path: Path) -> None:
    home = tmp_path / "home"
    env = _env(HELM_CACHE_HOME=str(home / "c"), HELM_CONFIG_HOME=str(home / "g"), HELM_DATA_HOME=str(home / "d"))
    reader = tmp_path / "reader"
    reader.mkdir()
    cwd = reader_dir(reader, helm_binary)
    done = subprocess.run(
        [str(helm_binary), *as_template(command.text)], cwd=cwd, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, f"{command}\n{done.stderr[-3000:]}"
    docs = [d for d in yaml.safe_load_all(done.stdout) if d]
    assert any(d["kind"] == "Deployment" for d in docs), f"{command}: rendered no Deployment"


def test_skipped_commands_are_listed_with_their_reason() -> None:
    """Not run here, by the table: each says what it needs (a GPU, the internet, root, a registry)."""
    skipped = [f"{c}  <- {_row(c).reason}" for c in _ids(How.SKIP)]
    assert all("<- " in s and not s.endswith("<- ") for s in skipped)


@pytest.mark.parametrize("command", _ids(How.SKIP), ids=str)
def test_needs_what_it_says(command: Command) -> None:
    pytest.skip(_row(command).reason)
