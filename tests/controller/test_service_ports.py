"""The activator's port map, by table: parsing what the ConfigMap holds, assigning and releasing."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from drain_router.decisions import service_ports
from drain_router.decisions.service_ports import Assignment

A = Assignment("team-a", "llama", "http")
A_GRPC = Assignment("team-a", "llama", "grpc")
B = Assignment("team-b", "qwen.v2", "http")


@pytest.mark.parametrize(
    ("data", "table"),
    [
        ({"20000": "team-a/llama/http"}, {20000: A}),
        ({"20000": "team-a/llama/http", "20001": "team-a/llama/grpc"}, {20000: A, 20001: A_GRPC}),
        ({"20000": "team-b/qwen.v2/http"}, {20000: B}),
        ({"20000": "team-a/llama/h2"}, {}),
        ({"20000": "Team-a/llama/http"}, {}),
        ({"20000": "team-a/llama"}, {}),
        ({"20000": "team-a/llama/http/x"}, {}),
        ({"20000": "team-a/../http"}, {}),
        ({"020000": "team-a/llama/http"}, {}),
        ({"0": "team-a/llama/http"}, {}),
        ({"65536": "team-a/llama/http"}, {}),
        ({"port": "team-a/llama/http"}, {}),
        ({"20000": 7}, {}),
        ({"20001": "team-a/llama/http", "20000": "team-a/llama/http"}, {20000: A}),
        (None, {}),
    ],
    ids=[
        "one",
        "two-protocols",
        "dotted-name",
        "unknown-protocol",
        "upper-case",
        "no-protocol",
        "extra-part",
        "dots-as-name",
        "leading-zero",
        "port-zero",
        "port-too-high",
        "not-a-port",
        "not-a-string",
        "one-service-two-ports-keeps-the-lower",
        "no-data",
    ],
)
def test_parse(data: dict[str, object] | None, table: dict[int, Assignment]) -> None:
    assert service_ports.parse(data) == table


def test_parse_keeps_only_ports_in_range() -> None:
    data = {"19999": "team-a/llama/http", "20000": "team-b/qwen.v2/http"}
    assert service_ports.parse(data, range(20000, 20010)) == {20000: B}


@pytest.mark.parametrize(
    ("table", "wanted", "ports", "new", "left"),
    [
        ({}, [A], range(20000, 20002), {20000: A}, ()),
        ({20000: A}, [A], range(20000, 20002), {20000: A}, ()),
        ({20000: A}, [B], range(20000, 20002), {20000: A, 20001: B}, ()),
        ({20001: A}, [B], range(20000, 20002), {20001: A, 20000: B}, ()),
        ({20000: A}, [B, A_GRPC], range(20000, 20002), {20000: A, 20001: A_GRPC}, (B,)),
        ({19000: A}, [A, B], range(20000, 20001), {19000: A, 20000: B}, ()),
        ({}, [B, A], range(20000, 20002), {20000: A, 20001: B}, ()),
    ],
    ids=["first", "kept", "next-free", "lowest-free", "full", "moved-range-keeps-old", "sorted"],
)
def test_assign(
    table: dict[int, Assignment],
    wanted: list[Assignment],
    ports: range,
    new: dict[int, Assignment],
    left: tuple[Assignment, ...],
) -> None:
    assert service_ports.assign(table, wanted, ports) == (new, left)


def test_release_drops_what_is_not_kept() -> None:
    table = {20000: A, 20001: A_GRPC, 20002: B}
    assert service_ports.release(table, lambda a: a.namespace != "team-a") == {20002: B}


@pytest.mark.parametrize(
    ("text", "ports"),
    [("20000-20999", range(20000, 21000)), ("1-1", range(1, 2)), (" 30000-30001 ", range(30000, 30002))],
)
def test_parse_range(text: str, ports: range) -> None:
    assert service_ports.parse_range(text) == ports


@pytest.mark.parametrize("text", ["20000", "20001-20000", "0-10", "1-65536", "a-b", "20000-", "-1-2"])
def test_parse_range_refuses(text: str) -> None:
    with pytest.raises(ValueError, match=r"expected FIRST-LAST|1\.\.65535"):
        service_ports.parse_range(text)


_names = st.from_regex(r"[a-z][a-z0-9]{0,8}", fullmatch=True)
_assignments = st.builds(Assignment, _names, _names, st.sampled_from(service_ports.PROTOCOLS))


@given(st.dictionaries(st.integers(20000, 20030), _assignments), st.lists(_assignments, max_size=40))
def test_assign_then_render_round_trips_and_never_moves_a_port(
    table: dict[int, Assignment], wanted: list[Assignment]
) -> None:
    """Whatever was there keeps its port; each assignment has at most one; the rendered data parses
    back to the same table (what the activator reads is what the controller wrote)."""
    table = service_ports.parse(service_ports.render(table))
    new, left = service_ports.assign(table, wanted, range(20000, 20032))
    assert all(new[port] == a for port, a in table.items())
    assert len(set(new.values())) == len(new)
    assert set(wanted) <= set(new.values()) | set(left)
    assert not left or all(port in new for port in range(20000, 20032))  # left over only when full
    assert service_ports.parse(service_ports.render(new)) == new
