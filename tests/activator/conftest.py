"""The activator tests' fixtures: the stand-in Kubernetes API, and every raw client closed after a test."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from drain_router_dev import fake_kube
from tests.blackbox import RawClient


@pytest.fixture(autouse=True)
async def close_clients() -> AsyncIterator[None]:
    yield
    await RawClient.close_all()


@pytest.fixture
async def kube() -> AsyncIterator[fake_kube.FakeKube]:
    async with fake_kube.kube_api() as api:
        yield api
