"""The README's "Try the router by hand" block, run as a reader would run it: bash, the package's
commands on PATH, nothing else started for it. Only its three ports are mapped to free ones, so the
test never meets another process on 8000, 8080 or 9091: in the block's text, and for the router,
which listens on its default ports there, through its environment variables."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from drain_router_dev import process

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
BEGIN, END = "<!-- by-hand:begin -->", "<!-- by-hand:end -->"
PORTS = ("8000", "8080", "9091")  # the fake model, the router's traffic and admin ports, as the block writes them


def by_hand_block(text: str) -> str:
    """The shell code between the by-hand markers (one fenced ``sh`` block)."""
    found = re.search(re.escape(BEGIN) + r"\s*```sh\n(.*?)```\s*" + re.escape(END), text, flags=re.S)
    assert found, f"README.md has no ```sh block between {BEGIN} and {END}"
    return found.group(1)


def with_free_ports(block: str) -> tuple[str, dict[str, str]]:
    """The block with its ports replaced by free ones, and the environment that moves the router's
    default ports (8080, 9091) to the same free ones."""
    ports: list[int] = []
    while len(ports) < len(PORTS):
        port = process.free_port()
        if port not in ports:
            ports.append(port)
    for written, free in zip(PORTS, ports, strict=True):
        block = re.sub(rf"\b{written}\b", str(free), block)
    return block, {"DRAIN_ROUTER_PORT": str(ports[1]), "DRAIN_ROUTER_ADMIN_PORT": str(ports[2])}


def run_block(block: str, extra_env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """bash runs the block in its own session; whatever it leaves behind is killed with the session."""
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("DRAIN_ROUTER_")} | extra_env | {"PATH": path}
    proc = subprocess.Popen(
        ["bash", "-c", block],
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=45)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"the block did not end within 45 s\nstdout:\n{out[-2000:]}\nstderr:\n{err[-3000:]}")
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def test_the_block_waits_for_readyz_before_the_first_request() -> None:
    """The first request to the traffic port comes after a loop that polls /readyz until it answers:
    a block that sends at once races the router's start (curl exit 7, connection refused)."""
    lines = by_hand_block(README.read_text()).splitlines()
    wait = next((i for i, line in enumerate(lines) if line.startswith("until curl") and "/readyz" in line), None)
    first = next((i for i, line in enumerate(lines) if "localhost:8080" in line), None)
    assert wait is not None, "no `until curl .../readyz` loop in the block"
    assert first is not None and wait < first


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_the_readme_by_hand_block_runs() -> None:
    """1. the fake model and a router start 2. the block waits for /readyz 3. a 10 s stream starts
    4. SIGTERM to the router 2 s in. Result: bash exits 0, the stream ends whole ([DONE]) with curl
    exiting 0, and the router exits 0 after it (drained, nothing cut); and it started without a
    ``startup.advisory`` (its grace is declared above its drain, and the health path it turns on
    keeps its defaults: a reader's first run must not greet them with a warning)."""
    if shutil.which("curl") is None:
        if os.environ.get("CI"):
            pytest.fail("curl is not installed but CI is set: .ci/run must install it")
        pytest.skip("curl is not installed (Debian: apt-get install curl); the README's block uses it")
    done = run_block(*with_free_ports(by_hand_block(README.read_text())))
    report = f"stdout:\n{done.stdout[-2000:]}\nstderr:\n{done.stderr[-3000:]}"
    assert done.returncode == 0, report
    assert "stream exited 0" in done.stdout, report
    assert "router exited 0" in done.stdout, report
    assert "data: [DONE]" in done.stdout, report
    assert done.stdout.index("data: [DONE]") < done.stdout.index("router exited 0"), report
    assert "startup.listening" in done.stdout + done.stderr, "the router's log is in the output read here"
    assert "startup.advisory" not in done.stdout + done.stderr, report


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(text: str) -> set[str]:
    fenced = re.sub(r"```.*?```", "", text, flags=re.S)
    return {_slug(m.group(1)) for m in re.finditer(r"^#{1,6} (.+)$", fenced, flags=re.M)}


def test_every_docs_page_is_linked_from_the_readme_and_every_link_resolves() -> None:
    """The README is the way into the reference: each docs/*.md is linked from it, and a relative link
    in the README or a docs page names a file that exists and, with a #fragment, one of its headings."""
    readme = README.read_text()
    pages = sorted((ROOT / "docs").glob("*.md"))
    unlinked = [p.name for p in pages if f"](docs/{p.name}" not in readme]
    assert not unlinked, f"docs pages the README does not link: {unlinked}"
    broken = []
    for source in [README, *pages]:
        text = re.sub(r"```.*?```", "", source.read_text(), flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue  # http(s):, mailto:
            path, _, fragment = target.partition("#")
            file = (source.parent / path).resolve() if path else source
            if not file.exists():
                broken.append(f"{source.relative_to(ROOT)}: {target} (no such file)")
            elif fragment and file.suffix == ".md" and fragment not in _anchors(file.read_text()):
                broken.append(f"{source.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


def test_every_serve_flag_is_in_the_configuration_page() -> None:
    """docs/configuration.md is the reference for `drain-router serve`: each of its flags (and the
    --no- form of a boolean pair) appears there, and no flag it lists is unknown to the command."""
    from drain_router import cli

    known: set[str] = set()
    for param in cli.serve.params:
        known.update(o for o in (*param.opts, *param.secondary_opts) if o.startswith("--") and o != "--help")
    page = (ROOT / "docs" / "configuration.md").read_text()
    listed = set(re.findall(r"`(--[a-z][a-z0-9-]*)", page)) | set(re.findall(r"/(--no-[a-z0-9-]+)`", page))
    missing = sorted(f for f in known if f not in listed)
    assert not missing, f"serve flags docs/configuration.md does not list: {missing}"
    unknown = sorted(listed - known)
    assert not unknown, f"docs/configuration.md lists flags serve does not have: {unknown}"
