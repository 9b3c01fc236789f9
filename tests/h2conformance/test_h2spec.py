"""Every h2spec case (tests/h2conformance/cases.py) against every target: the router process in
front of the gRPC test upstream and in front of nghttpd, the gRPC listener in process, and the
reference server nghttpd (marker ``nghttpd``). The reference server's known failure is marked xfail
for it alone, at collection (conftest.py)."""

from __future__ import annotations

import pytest

from tests.h2conformance.cases import CASES, Case, Target, run

pytestmark = pytest.mark.asyncio(loop_scope="module")

TARGETS = [
    pytest.param("router", id="router"),
    pytest.param("router-nghttpd", id="router-nghttpd"),
    pytest.param("listener", id="listener"),
    pytest.param("nghttpd", id="nghttpd", marks=pytest.mark.nghttpd),
]


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
@pytest.mark.parametrize("target", TARGETS, indirect=True)
async def test_h2spec(target: Target, case: Case) -> None:
    await run(case, target)
