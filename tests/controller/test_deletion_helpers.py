"""Helper tables (``tests/cases/deletion/helpers/``): knobs, next stage edges, pod counts, route lookup,
plus the duration language shared by annotations and the CRD."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from drain_router.controller.kube import observe
from drain_router.decisions import deletion, durations, objects

from . import casefiles

T0 = durations.parse_time("2025-01-01T00:00:00Z")


@pytest.mark.parametrize("row", casefiles.load_table("knobs.yaml"))
def test_knobs(row: dict[str, Any]) -> None:
    resolution = deletion.resolve_knobs(row["annotations"], observe.deletion_spec(row["spec"]))
    expect = row["expect"]
    knobs = resolution.knobs
    got = {
        "maxWait": knobs.max_wait,
        "routeSettle": knobs.route_settle,
        "forceDeleteAfter": knobs.force_delete_after,
        "orphan": knobs.orphan,
        "invalid": [i.key for i in resolution.invalid],
    }
    assert {k: got[k] for k in expect} == expect


def test_invalid_annotation_message_names_key_value_and_fallback() -> None:
    (invalid,) = deletion.resolve_knobs({deletion.ANNOTATION_ROUTE_SETTLE: "soon"}, None).invalid
    assert invalid.event_reason is deletion.Reason.INVALID_ANNOTATION
    assert "drainrouter.dev/route-settle='soon'" in invalid.message
    assert "60s" in invalid.message and "spec or default" in invalid.message


@pytest.mark.parametrize("row", casefiles.load_table("pod-counts.yaml"))
def test_pod_counts(row: dict[str, Any]) -> None:
    pods = [casefiles.pod_observation(p) for p in row["pods"]]
    counted = deletion.count_pods(pods, row["nodes"], T0 + 600)
    expect = row["expect"]
    assert counted.count == expect["count"]
    assert [p.name for p in counted.remaining if p.stuck] == expect["stuck"]
    assert counted.message == expect["message"]


@pytest.mark.parametrize("row", casefiles.load_table("route-lookup.yaml"))
def test_route_lookup(row: dict[str, Any]) -> None:
    found = deletion.find_route(observe.service_spec(row["spec"]))
    as_dict = None if found is None else {"apiVersion": found.api_version, "kind": found.kind, "name": found.name}
    assert as_dict == row["expect"]


ROUTE = {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute", "name": "llama"}


def _object(state: str, ref: dict[str, str]) -> deletion.ObjectObservation:
    """``state``: present, absent, deleting, foreign (labelled for another service) or notOwned."""
    data = {**ref, "exists": state != "absent", "deleting": state == "deleting"}
    if state == "foreign":
        data["serviceLabel"] = "other"
    return casefiles.object_observation({**data, "owned": state != "notOwned"})


def _status(data: dict[str, Any] | None) -> deletion.DeletionStatus | None:
    if data is None:
        return None
    times = {"startedAt", "deadline", "routeRemovedAt", "uninstalledAt", "podsGoneAt"}
    return deletion.DeletionStatus.from_dict(
        {k: durations.format_time(T0 + v) if k in times else v for k, v in data.items()}
    )


def _failure(data: dict[str, Any]) -> deletion.ApiFailure:
    return deletion.ApiFailure(call=data["call"], code=data["code"], message=data["message"])


@pytest.mark.parametrize("row", casefiles.load_table("next-stage.yaml") + casefiles.load_table("failures.yaml"))
def test_next_stage(row: dict[str, Any]) -> None:
    knob_rows = row.get("knobs", {})
    knobs = deletion.Knobs(
        max_wait=knob_rows.get("maxWait", deletion.DEFAULT_MAX_WAIT_SECS),
        route_settle=knob_rows.get("routeSettle", deletion.DEFAULT_ROUTE_SETTLE_SECS),
        force_delete_after=knob_rows.get("forceDeleteAfter"),
        orphan=knob_rows.get("orphan", False),
    )
    pods = row.get("pods", [])
    if isinstance(pods, int):
        pods = [f"p{i:02d}" for i in range(pods)]
    workload = row.get("workload", ["present"])
    deleted = None if row.get("podsDeletedAt") is None else T0 + row["podsDeletedAt"]
    obs = deletion.Observations(
        service="llama",
        route=None if row["route"] == "none" else _object(row["route"], ROUTE),
        workload=tuple(
            _object(state, {"apiVersion": "apps/v1", "kind": "Deployment", "name": f"w{i}"})
            for i, state in enumerate(workload)
        ),
        pods=tuple(objects.Pod(name=name, uid=f"uid-{name}", node="n1", deletion_timestamp=deleted) for name in pods),
        nodes=row.get("nodes", {"n1": True}),
        failed_reads=tuple(
            deletion.FailedRead(subject=deletion.Subject(f["subject"]), failure=_failure(f))
            for f in row.get("failedReads", ())
        ),
        failed_actions=tuple(_failure(f) for f in row.get("failedActions", ())),
    )
    decision = deletion.next_stage(_status(row["status"]), obs, knobs, T0 + row["now"])
    expect = row["expect"]
    status = decision.status
    if "verdict" in expect:
        assert decision.verdict.value == expect["verdict"]
    if "stage" in expect:
        assert status is not None and (status.stage and status.stage.value) == expect["stage"]
    if "startedAt" in expect:
        assert status is not None and status.started_at == T0 + expect["startedAt"]
    if "message" in expect:
        assert status is not None and status.message == expect["message"]
    if "outcome" in expect:
        assert status is not None and status.outcome is not None and status.outcome.value == expect["outcome"]
    if "deadline" in expect:
        assert status is not None and status.deadline == T0 + expect["deadline"]
    if "requeueAt" in expect:
        assert decision.requeue_at == (None if expect["requeueAt"] is None else T0 + expect["requeueAt"])
    if "actions" in expect:
        assert sorted({a.kind.value for a in decision.actions}) == expect["actions"]
    if "actionCount" in expect:
        assert len(decision.actions) == expect["actionCount"]
    if "events" in expect:
        assert [e.reason.value for e in decision.events] == expect["events"]
    if "podsRemaining" in expect:
        assert status is not None and status.pods_remaining == expect["podsRemaining"]
    if "listedPods" in expect:
        assert status is not None and len(status.pods) == expect["listedPods"]
    if "notOwned" in expect:
        assert status is not None and list(status.not_owned) == expect["notOwned"]
    if "forceDeletedCount" in expect:
        assert status is not None and status.force_deleted_count == expect["forceDeletedCount"]
    if "forceDeletedListed" in expect:
        assert status is not None and len(status.force_deleted) == expect["forceDeletedListed"]


@pytest.mark.parametrize(
    ("stage", "outcome", "status", "reason"),
    [
        (None, None, "True", "Starting"),
        ("RouteRemoving", None, "True", "RouteRemoving"),
        ("RouteSettling", None, "True", "RouteSettling"),
        ("Uninstalling", None, "True", "Uninstalling"),
        ("Uninstalling", "NoRoute", "True", "NoRoute"),
        ("Uninstalling", "RouteStuck", "True", "RouteStuck"),
        ("PodsTerminating", "RouteStuck", "True", "WaitingForPods"),
        ("ForceDeleting", "PodsForceDeleted", "True", "PodsForceDeleted"),
        ("Released", "Clean", "False", "Released"),
        ("Released", "PodsForceDeleted", "False", "Released"),
        ("Released", "TimedOut", "False", "TimedOut"),
    ],
)
def test_condition_reason(stage: str | None, outcome: str | None, status: str, reason: str) -> None:
    cond = deletion.condition_for(deletion.DeletionStatus.from_dict({"stage": stage, "outcome": outcome}))
    assert (cond.type, cond.status, cond.reason.value) == ("Deleting", status, reason)


def test_condition_reasons_cover_every_stage() -> None:
    for stage in deletion.Stage:
        for outcome in (None, *deletion.Outcome):
            cond = deletion.condition_for(deletion.DeletionStatus(stage=stage, outcome=outcome))
            assert cond.type == "Deleting"
            assert cond.status == ("False" if stage is deletion.Stage.RELEASED else "True")


def _deleting(status: str, reason: deletion.Reason, message: str) -> objects.Condition:
    return objects.Condition(type=deletion.CONDITION_TYPE, status=status, reason=reason, message=message)


def test_set_condition_keeps_transition_time_while_unchanged() -> None:
    cond = _deleting("True", deletion.Reason.WAITING_FOR_PODS, "waiting for 2 pods")
    first = objects.set_condition([{"type": "Ready", "status": "True"}], cond, T0)
    assert first[1]["reason"] == "WaitingForPods" and type(first[1]["reason"]) is str
    later = objects.set_condition(
        first, _deleting("True", deletion.Reason.WAITING_FOR_PODS, "waiting for 1 pod"), T0 + 5
    )
    assert later[0] == {"type": "Ready", "status": "True"}
    assert later[1]["lastTransitionTime"] == "2025-01-01T00:00:00Z" and later[1]["message"] == "waiting for 1 pod"
    moved = objects.set_condition(later, _deleting("False", deletion.Reason.RELEASED, "released"), T0 + 9)
    assert moved[1]["lastTransitionTime"] == "2025-01-01T00:00:09Z"


def test_status_round_trips() -> None:
    status = deletion.DeletionStatus(
        stage=deletion.Stage.FORCE_DELETING,
        outcome=deletion.Outcome.PODS_FORCE_DELETED,
        started_at=T0,
        deadline=T0 + 3600,
        route_removed_at=T0 + 1.25,
        pods_remaining=1,
        force_deleted=("a",),
        message="m",
    )
    assert deletion.DeletionStatus.from_dict(status.as_dict()) == status


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("0", 0),
        ("0s", 0),
        ("60s", 60),
        ("1h", 3600),
        ("1h30m", 5400),
        ("1.5s", 1.5),
        ("250ms", 0.25),
        ("2m3s", 123),
    ],
)
def test_durations(text: str, seconds: float) -> None:
    assert durations.parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "60", "-1s", "1d", "1 h", "s", "1h-5m", "∞", "1.s"])
def test_invalid_durations(text: str) -> None:
    with pytest.raises(durations.DurationError):
        durations.parse_duration(text)


@given(st.integers(min_value=0, max_value=10**9))
def test_format_duration_round_trips(millis: int) -> None:
    assert durations.parse_duration(durations.format_duration(millis / 1000)) == pytest.approx(millis / 1000)


@given(st.floats(min_value=0, max_value=4_000_000_000, allow_nan=False))
def test_time_round_trips(epoch: float) -> None:
    assert durations.parse_time(durations.format_time(epoch)) == pytest.approx(epoch, abs=1e-5)
