"""The e2e's reading of a router's /metrics (``cluster.parse_metrics``), on the router's own exposition."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from drain_router.metrics import Metrics, Outcome
from drain_router_dev import cluster


def test_grpc_streams_are_read_apart_and_together() -> None:
    """HTTP requests and gRPC streams by outcome, each on its own and added up (the chaos run counts
    both as requests); in flight and the state as the router renders them."""
    metrics = Metrics(CollectorRegistry())
    for code, outcome in [(200, Outcome.COMPLETED), (200, Outcome.COMPLETED), (502, Outcome.UPSTREAM_ERROR)]:
        metrics.count_request(code, outcome, 0.1)
    for status, outcome in [("0", Outcome.COMPLETED), ("14", Outcome.UPSTREAM_ERROR), ("none", Outcome.CLIENT_ABORTED)]:
        metrics.count_grpc(status, outcome, 0.1)
    metrics.track_inflight(lambda: 4)
    metrics.set_state("draining", ["serving", "draining"])
    scrape = cluster.parse_metrics(generate_latest(metrics.registry).decode())
    assert scrape.outcomes == {"completed": 2, "upstream_error": 1}
    assert scrape.grpc_outcomes == {"completed": 1, "upstream_error": 1, "client_aborted": 1}
    assert scrape.every_outcome == {"completed": 3, "upstream_error": 2, "client_aborted": 1}
    assert (scrape.inflight, scrape.state) == (4, "draining")
