"""The five outcomes are one enumeration: the proxy writes none of them as a bare string, so a typo
is a name error (and a type error under mypy), never a sixth ``outcome`` label."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from drain_router import metrics
from drain_router.metrics import Outcome

PACKAGE = Path(metrics.__file__).parent
#: The traffic path's modules: every place an outcome is produced.
TRAFFIC = [
    *sorted(p for d in ("http1", "grpc", "runtime", "admission", "activator") for p in (PACKAGE / d).rglob("*.py")),
    PACKAGE / "state.py",
]
SPEC_OUTCOMES = {"completed", "client_aborted", "upstream_error", "deadline_aborted", "rejected"}


def test_the_enumeration_is_the_spec_list() -> None:
    assert {o.value for o in Outcome} == SPEC_OUTCOMES


def test_the_traffic_path_is_found() -> None:
    assert len(TRAFFIC) > 40, TRAFFIC  # the parametrization below is over the real tree


@pytest.mark.parametrize("module", TRAFFIC, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_bare_outcome_string_in_the_proxy(module: Path) -> None:
    """Every outcome the proxy produces comes from :class:`Outcome` (words inside docstrings and log
    messages are longer strings and do not match)."""
    tree = ast.parse(module.read_text())
    slots = {  # attribute names (a counter called ``completed``) are not outcomes
        id(const)
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__slots__" for t in node.targets)
        for const in ast.walk(node.value)
    }
    bare = [
        f"{module.name}:{node.lineno}: {node.value!r}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and node.value in SPEC_OUTCOMES and id(node) not in slots
    ]
    assert not bare, bare


def test_requests_total_labels_are_the_outcome_values() -> None:
    registry = CollectorRegistry()
    m = metrics.Metrics(registry)
    for outcome in Outcome:
        m.count_request(200, outcome, 0.1)
    labels = {
        sample.labels["outcome"]
        for family in registry.collect()
        if family.name == "drain_router_requests"
        for sample in family.samples
    }
    assert labels == SPEC_OUTCOMES
