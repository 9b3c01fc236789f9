"""``python -m bench.ws_close_at``: what each ``--websocket-close-at`` costs a rolling restart with live
realtime sessions, measured on this machine (loopback only, bounded in time).

For each mode: ``--replicas`` pods (a fake model server and a router in front of it, as in a pod),
``--clients`` realtime clients on the fake model's ``/v1/realtime`` that talk in turns (``response.create``,
its deltas, ``response.done``) with pauses between turns, and a rolling restart of the routers: each in
turn is taken out of the clients' rotation (what a balancer does once the endpoint is removed), sent
SIGTERM, waited for, started again and put back. A client whose session ends reconnects at once to
the next router in rotation. Recorded: the rollout's length, each router's drain time and exit code,
and how each session the routers ended looked to its client: closed between turns or cut in the
middle of a response (a lost turn), and the close code it saw.

Run it alone (it uses a few processes for a minute or two); it prints a Markdown table and JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import dataclasses
import json
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

from drain_router.decisions import websocket_close
from drain_router_dev import cluster

PAUSE_SECS = (0.5, 6.0)
"""A client waits between the end of a response and its next turn a time drawn evenly from this range
(seeded per client, so runs repeat): about half the pauses are shorter than the quiet period."""
DELTAS = 20
INTERVAL_MS = 50
"""A response: 20 deltas 50 ms apart, about 1 s."""
RECEIVE_TIMEOUT = 15.0
ENDED = (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSING, aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.ERROR)


@dataclasses.dataclass(frozen=True, slots=True)
class End:
    """A session the server side ended, as its client saw it."""

    at: float
    code: int | None
    mid_turn: bool


@dataclasses.dataclass(slots=True)
class Rotation:
    """The routers a client may connect to (a balancer's healthy endpoints), round robin."""

    up: list[cluster.Replica]
    turn: int = 0

    def next(self) -> cluster.Replica:
        self.turn += 1
        return self.up[self.turn % len(self.up)]


class _Gone(Exception):
    def __init__(self, code: int | None) -> None:
        self.code = code


async def _receive(ws: Any, timeout: float) -> dict[str, Any]:
    msg = await ws.receive(timeout=timeout)
    if msg.type in ENDED:
        raise _Gone(msg.data if msg.type is aiohttp.WSMsgType.CLOSE else ws.close_code)
    return dict(json.loads(msg.data)) if msg.type is aiohttp.WSMsgType.TEXT else {}


async def client(index: int, rotation: Rotation, ends: list[End], turns: list[int]) -> None:
    """One realtime user: a session, turns with pauses, and a new session whenever one ends."""
    create = json.dumps({"type": "response.create", "response": {"deltas": DELTAS, "interval_ms": INTERVAL_MS}})
    pauses = random.Random(index)
    timeout = aiohttp.ClientWSTimeout(ws_receive=None, ws_close=5.0)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as http:
        while True:
            try:
                ws = await http.ws_connect(rotation.next().url + "/v1/realtime", timeout=timeout)
            except (aiohttp.ClientError, OSError):
                await asyncio.sleep(0.05)  # no router there: try the next one
                continue
            mid_turn = False
            try:
                await _receive(ws, RECEIVE_TIMEOUT)  # session.created
                while True:
                    with contextlib.suppress(aiohttp.ClientConnectionResetError):
                        await ws.send_str(create)
                    mid_turn = True
                    while (await _receive(ws, RECEIVE_TIMEOUT)).get("type") != "response.done":
                        pass
                    mid_turn = False
                    turns[index] += 1
                    with contextlib.suppress(TimeoutError):  # the pause, unless the session ends in it
                        await _receive(ws, pauses.uniform(*PAUSE_SECS))
            except _Gone as gone:
                ends.append(End(time.monotonic(), gone.code, mid_turn))
            except (TimeoutError, aiohttp.ClientError, OSError, ValueError):
                ends.append(End(time.monotonic(), ws.close_code, mid_turn))
            finally:
                await ws.close()


def summarize(mode: str, rollout: float, drains: list[float], exits: list[int], ends: list[End]) -> dict[str, Any]:
    """One mode's row: the rollout, the routers' drains and exits, and the sessions they ended."""
    codes = collections.Counter("none" if e.code is None else str(e.code) for e in ends)
    return {
        "mode": mode,
        "rollout_secs": round(rollout, 1),
        "drain_secs": [round(d, 1) for d in drains],
        "exit_codes": exits,
        "sessions_ended": len(ends),
        "between_turns": sum(1 for e in ends if not e.mid_turn),
        "cut_mid_turn": sum(1 for e in ends if e.mid_turn),
        "close_codes": dict(sorted(codes.items())),
    }


def markdown(rows: list[dict[str, Any]], args: argparse.Namespace) -> str:
    lines = [
        f"{args.replicas} routers restarted in turn, {args.clients} realtime sessions, drain window "
        f"{args.drain} s, grace {args.grace} s, quiet period {websocket_close.WEBSOCKET_QUIET_SECS:g} s:",
        "",
        "| `--websocket-close-at` | rollout | each router's drain | router exits | sessions ended by the drain "
        "| closed between turns | cut mid-turn | close codes seen |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        codes = ", ".join(f"{code} x{n}" for code, n in r["close_codes"].items()) or "-"
        lines.append(
            f"| `{r['mode']}` | {r['rollout_secs']} s | {' '.join(map(str, r['drain_secs']))} s | "
            f"{' '.join(map(str, r['exit_codes']))} | {r['sessions_ended']} | {r['between_turns']} | "
            f"{r['cut_mid_turn']} | {codes} |"
        )
    return "\n".join(lines)


async def run_mode(mode: str, args: argparse.Namespace, logs: Path) -> dict[str, Any]:
    """One rolling restart of ``args.replicas`` routers in ``mode`` under ``args.clients`` sessions."""
    models = [cluster.FakeModel(logs, name=f"{mode}-model-{i}") for i in range(args.replicas)]
    routers = [
        cluster.Replica(
            f"{mode}-router-{i}",
            model.url,
            logs,
            shutdown_drain_secs=args.drain,
            termination_grace_secs=args.grace,
            extra_args=("--websocket-close-at", mode),
        )
        for i, model in enumerate(models)
    ]
    ends: list[End] = []
    turns = [0] * args.clients
    tasks: list[asyncio.Task[None]] = []
    try:
        async with aiohttp.ClientSession() as http:
            for model, router in zip(models, routers, strict=True):
                await model.start(http)
                await router.start(http)
            rotation = Rotation(list(routers))
            tasks = [asyncio.create_task(client(i, rotation, ends, turns)) for i in range(args.clients)]
            async with asyncio.timeout(60):  # warmed up: every client has had two turns (out of step by now)
                while min(turns) < 2:
                    await asyncio.sleep(0.05)
            started = time.monotonic()
            drains, exits = [], []
            for router in routers:
                rotation.up.remove(router)
                signalled = time.monotonic()
                router.sigterm()
                exits.append(await router.process.wait_exit(timeout=args.grace + 10))
                drains.append(time.monotonic() - signalled)
                await router.start(http)
                rotation.up.append(router)
            rollout = time.monotonic() - started
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for process in [*(r.process for r in routers), *(m.process for m in models)]:
            process.kill()
    return summarize(mode, rollout, drains, exits, [e for e in ends if started <= e.at])


async def main(args: argparse.Namespace) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory(prefix="ws-close-at-") as logs:
        rows = []
        for mode in args.modes:
            async with asyncio.timeout(args.replicas * (args.grace + 30) + 60):
                rows.append(await run_mode(mode, args, Path(logs)))
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
        return rows


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.ws_close_at", description=__doc__.split("\n\n")[0])
    parser.add_argument("--modes", nargs="+", choices=websocket_close.MODES, default=list(websocket_close.MODES))
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--clients", type=int, default=6)
    parser.add_argument("--drain", type=int, default=1, help="each router's --shutdown-drain-secs")
    parser.add_argument("--grace", type=int, default=10, help="each router's --termination-grace-secs")
    return parser.parse_args(argv)


if __name__ == "__main__":
    arguments = parse()
    print(markdown(asyncio.run(main(arguments)), arguments))
