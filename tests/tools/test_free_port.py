"""``free_port``: a port below the kernel's ephemeral range, bindable when handed out, never handed
out twice, so a process restarted on it can bind it again whatever connections the machine opened
in between (CI once failed a fault test on a model server whose port a client connection had taken
as its local port between two of its starts)."""

from __future__ import annotations

import socket

import pytest

from drain_router_dev import process


def test_ports_are_below_the_ephemeral_range_bindable_and_never_repeated() -> None:
    low, _ = process._ephemeral_range()
    ports = [process.free_port() for _ in range(200)]
    assert len(set(ports)) == len(ports)
    assert all(process.FIRST_PORT <= port < low for port in ports), sorted(ports)[-3:]
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((process.LOOPBACK, ports[-1]))


def test_a_port_something_is_bound_to_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    """The pick lands first on a port a listener holds, then on a free one: the free one comes back."""
    busy, fresh = process.free_port(), process.free_port()
    process._HANDED_OUT.difference_update({busy, fresh})  # as if never handed out
    picks = iter([busy, fresh])

    class Picks:
        def randrange(self, start: int, stop: int) -> int:
            return next(picks)

    monkeypatch.setattr(process, "_PICK", Picks())
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind((process.LOOPBACK, busy))
        listener.listen()
        assert process.free_port() == fresh
