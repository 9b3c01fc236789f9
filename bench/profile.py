"""``python -m bench profile``: py-spy on the router while the bench drives one workload at it.

Starts the bench upstream and a router (pinned like in the bench), records with
``py-spy record --format raw`` for the load's duration, and prints where the samples fall: by
function (self and inclusive) and by package. Needs py-spy (``pip install py-spy``; not a
dependency of anything) and ptrace permission on the router process.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from bench import grpcload, harness, loadgen, targets

_FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")


_ENTRY_FILES = (
    "click/",
    "asyncio/runners.py",
    "drain-router",
    "drain_router/cli.py",
    "drain_router/runtime/lifecycle.py",
)


_REPO_ROOT = str(Path(__file__).resolve().parents[1]) + "/"


def _short(path: str) -> str:
    if path.startswith(_REPO_ROOT):
        return path[len(_REPO_ROOT) :]
    for marker in ("site-packages/", "/lib/python3."):
        if marker in path:
            tail = path.split(marker, 1)[1]
            return tail.split("/", 1)[1] if marker == "/lib/python3." else tail
    return path.rsplit("/", 3)[-1] if path.count("/") > 3 else path


def _package(file: str) -> str:
    if file.startswith("drain_router/"):
        return "router (" + file.split("/")[-1] + ")"
    if "/" not in file and file.endswith(".py"):
        return "stdlib " + file
    top = file.split("/", 1)[0]
    return "stdlib asyncio" if top == "asyncio" else top


def parse(raw_text: str) -> tuple[int, collections.Counter[str], collections.Counter[str], collections.Counter[str]]:
    """Collapsed stacks -> (total samples, self by function, inclusive by function, self by package)."""
    total = 0
    self_fn: collections.Counter[str] = collections.Counter()
    incl_fn: collections.Counter[str] = collections.Counter()
    self_pkg: collections.Counter[str] = collections.Counter()
    for line in raw_text.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        total += count
        names = []
        for frame in stack.split(";"):
            match = _FRAME.match(frame.strip())
            if not match:
                continue  # a thread or process label
            file = _short(match["file"])
            names.append((f"{match['func']} ({file})", file))
        if not names:
            continue
        leaf, leaf_file = names[-1]
        self_fn[leaf] += count
        self_pkg[_package(leaf_file)] += count
        for name, file in set(names):
            if not file.startswith(_ENTRY_FILES):  # the process entry chain is in every stack
                incl_fn[name] += count
    return total, self_fn, incl_fn, self_pkg


def render(
    title: str,
    total: int,
    self_fn: collections.Counter[str],
    incl_fn: collections.Counter[str],
    self_pkg: collections.Counter[str],
    top: int = 15,
) -> str:
    def table(counter: collections.Counter[str], head: str) -> list[str]:
        rows = [f"| {head} | % of samples |", "| --- | --- |"]
        rows += [f"| `{name}` | {100 * n / total:.1f} |" for name, n in counter.most_common(top)]
        return rows

    out = [f"#### {title} ({total} samples)", ""]
    out += [*table(self_pkg, "self time by package"), ""]
    out += [*table(self_fn, "self time by function"), ""]
    out += [*table(incl_fn, "inclusive time by function"), ""]
    return "\n".join(out)


async def _drive(
    workload: str, router: targets.Target, seconds: float, concurrency: int, cpus: set[int] | None
) -> dict:
    url = router.url
    if workload == "grpc_stream":
        plan = harness.PLANS["full"]
        return await grpcload.stream(
            "127.0.0.1", router.grpc_port, concurrency, seconds, messages=plan.grpc_messages, warmup=0.3
        )
    if workload == "grpc_unary":
        if grpcload.h2load_available():
            return await asyncio.to_thread(
                grpcload.h2load,
                f"http://127.0.0.1:{router.grpc_port}",
                8,
                concurrency // 8 or 1,
                seconds,
                body_bytes=128,
            )
        return await grpcload.unary(
            "127.0.0.1", router.grpc_port, 8, concurrency // 8 or 1, seconds, body_bytes=128, warmup=0.2
        )
    if workload == "small_get":
        if loadgen.wrk_available():
            return await asyncio.to_thread(loadgen.wrk, url + "/small", concurrency, seconds, cpus=cpus)
        return await loadgen.requests(url + "/small", concurrency, seconds)
    if workload in ("sse_burst", "sse_oneread"):
        return await loadgen.sse(
            url + "/v1/completions?chunks=64&interval_ms=0" + ("&oneread=1" if workload == "sse_oneread" else ""),
            concurrency,
            seconds,
            expected_events=65,
            stagger=0.05,
            warmup=0.1,
            stream_seconds=0.1,
        )
    return await loadgen.sse(
        url + "/v1/completions?chunks=32&interval_ms=30",
        concurrency,
        seconds,
        expected_events=33,
        stagger=1.0,
        warmup=1.2,
        stream_seconds=1.0,
    )


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench profile", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--workload",
        choices=["small_get", "sse_burst", "sse_oneread", "sse_paced", "grpc_stream", "grpc_unary"],
        default="small_get",
    )
    parser.add_argument(
        "--concurrency",
        type=int,
        default=64,
        help="connections (SSE: streams; grpc_stream: calls on one connection; grpc_unary: calls at a time on 8)",
    )
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    parser.add_argument("--native", action="store_true", help="also sample C frames (uvloop, parsers)")
    parser.add_argument("--out", type=Path, default=Path("/tmp"), help="where the raw profile goes")
    args = parser.parse_args(argv)
    pyspy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not os.path.exists(pyspy):
        print("py-spy not found: pip install py-spy", file=sys.stderr)
        return 1
    bench = harness.Harness(harness.PLANS["quick"], ["router"], lambda m: print(m, file=sys.stderr))
    bench.start_upstream(grpc=args.workload.startswith("grpc_"))
    router = targets.Router("router", "drain-router")
    router.start(bench.ctx)
    raw = args.out / f"pyspy-router-{args.workload}-{args.concurrency}.txt"
    try:
        if bench.loadgen_cpus:
            os.sched_setaffinity(0, bench.loadgen_cpus)
        asyncio.run(loadgen.requests(router.url + "/small", 4, 0.3))  # warm the pool
        cmd = [
            pyspy,
            "record",
            "--pid",
            str(router.pid),
            "--rate",
            str(args.rate),
            "--duration",
            str(int(args.seconds)),
            "--format",
            "raw",
            "--output",
            str(raw),
        ]
        # Native stacks need the process stopped while sampling; Python-only sampling does not.
        cmd.append("--native" if args.native else "--nonblocking")
        spy = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        time.sleep(0.5)
        import uvloop

        result = uvloop.run(_drive(args.workload, router, args.seconds - 1, args.concurrency, bench.loadgen_cpus))
        _, err = spy.communicate(timeout=args.seconds + 30)
        if spy.returncode != 0:
            print(err.decode(errors="replace"), file=sys.stderr)
            return 1
    finally:
        router.stop()
        bench.stop_all()
        shutil.rmtree(bench.workdir, ignore_errors=True)
    brief = {k: round(v, 3) for k, v in result.items() if isinstance(v, float)}
    title = f"router, {args.workload} at {args.concurrency}: {brief}"
    print(render(title, *parse(raw.read_text())))
    print(f"raw profile: {raw}", file=sys.stderr)
    return 0
