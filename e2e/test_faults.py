"""Faults during rolling restarts, behind HAProxy and behind Envoy, every request reconciled.

Each test runs one fault of ``e2e/chaos.py`` (its docstring states the expected outcome) for
``CYCLES`` rolling-restart cycles of two pods (a fake model server and a router each) behind a real
balancer, then reconciles what the clients saw, what the routers counted and what the model servers
served, realtime (WebSocket) sessions and gRPC calls included (they run beside the streams for the
whole run; a gRPC call is a request in every view). With the drain on, every lost request must be
accounted for by a view, every session that did not end with Close 1000 or 1001 must be one the
fault cut, and every balance must hold; the drain-off control must show lost requests that no view
accounts for.
"""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest

from drain_router_dev.process import Process, wait_until
from e2e import chaos

CYCLES = 1


async def _run(
    kind: str,
    fault: str,
    drain_secs: int,
    cycles: int,
    session: aiohttp.ClientSession,
    processes: list[Process],
    tmp_path: Path,
    report: list[str],
    *,
    until_loss: bool = False,
) -> chaos.Fleet:
    fleet = chaos.Fleet(tmp_path, kind, session, processes.append, drain_secs=drain_secs, seed=15)
    await fleet.start()

    await wait_until(
        lambda: len(fleet.load.records), 20, "the first streams to finish", until=lambda n: n >= chaos.CLIENTS
    )
    for number in range(1, cycles + 1):
        report.append(chaos.format_row(await fleet.cycle(number, fault)))
        if until_loss and (fleet.load.lost or fleet.grpc.lost):
            break  # the control has shown a loss; more cycles would only take time
    fleet.result = await fleet.finish()
    report.append(chaos.format_reconciliation(fleet.result))
    return fleet


@pytest.mark.timeout(90)
@pytest.mark.parametrize("fault", list(chaos.FAULTS))
async def test_fault_during_rolling_restart(
    fault: str,
    balancer_kind: str,
    session: aiohttp.ClientSession,
    processes: list[Process],
    tmp_path: Path,
    report: list[str],
) -> None:
    """Expected, for every fault: its own expectations hold (exit codes, readiness, the expedite),
    every lost request is one the fault explains, and so is every session that did not end with
    1000 or 1001 (see the fault's docstring in e2e/chaos.py); sessions were seen ending."""
    fleet = await _run(balancer_kind, fault, chaos.DRAIN_SECS, CYCLES, session, processes, tmp_path, report)
    assert fleet.ledger.problems == []
    assert fleet.result.unaccounted == 0, chaos.format_reconciliation(fleet.result)
    assert fleet.result.sessions.unexplained == 0, fleet.unexplained_sessions()
    assert fleet.result.mismatches == (), chaos.format_reconciliation(fleet.result)
    assert fleet.result.sessions.sessions >= chaos.SESSION_CLIENTS, chaos.format_reconciliation(fleet.result)
    calls = fleet.grpc.records
    assert len(calls) >= chaos.GRPC_CLIENTS, f"only {len(calls)} gRPC calls: they did not run beside the streams"


@pytest.mark.timeout(150)
async def test_drain_off_control_loses_unaccounted_requests(
    balancer_kind: str,
    session: aiohttp.ClientSession,
    processes: list[Process],
    tmp_path: Path,
    report: list[str],
) -> None:
    """Expected: with --shutdown-drain-secs 0, plain rolling restarts lose requests that no view
    accounts for (the balancer still sends to a router that closed its listener): the
    reconciliation can see a loss. A cycle without drain loses requests only when one lands in
    the gap between the listener closing and the balancer's next probe, so cycles run until the
    first loss (at most 10); no loss in 10 cycles fails."""
    fleet = await _run(balancer_kind, "none", 0, 10, session, processes, tmp_path, report, until_loss=True)
    assert fleet.ledger.problems == []
    assert fleet.result.unaccounted > 0, chaos.format_reconciliation(fleet.result)
