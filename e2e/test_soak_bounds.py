"""The soak's resource bound (``e2e/soak.py``): a flat router passes, a leaking one fails. Pure."""

from __future__ import annotations

from e2e import chaos, soak

MIB = 2**20


def _samples(rss: list[float], fds: list[int]) -> list[chaos.Sample]:
    return [chaos.Sample(float(i), "router-2", 42, int(r * MIB), f) for i, (r, f) in enumerate(zip(rss, fds))]


def test_flat_router_holds() -> None:
    rss = [47.0 + (i % 3) * 0.2 for i in range(100)]
    fds = [16 + (i % 10) for i in range(100)]  # connections come and go with the traffic
    assert soak.growth_problems(_samples(rss, fds)) == []


def test_growing_rss_fails() -> None:
    rss = [47.0 + i * 0.25 for i in range(100)]  # +25 MiB over the run
    assert [p for p in soak.growth_problems(_samples(rss, [16] * 100)) if "RSS" in p]


def test_growing_descriptors_fail() -> None:
    fds = [16 + i // 4 for i in range(100)]  # one descriptor leaked every four cycles
    assert [p for p in soak.growth_problems(_samples([47.0] * 100, fds)) if "descriptors" in p]


def test_too_few_samples_judge_nothing() -> None:
    assert soak.growth_problems(_samples([47.0, 90.0], [16, 90])) == []
