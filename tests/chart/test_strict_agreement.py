"""The chart's hard refusals and ``drain-router check --strict`` agree: for each value set, helm
refuses to render exactly when the router, run with the flags the rendered pod would get, reports
an advisory (``check --strict`` exits 1). A CI gate running ``check --strict`` on a pod's flags
and the chart's own render-time checks then refuse the same configurations.

Both sides are real: helm renders the model chart, and ``drain-router check --strict`` runs as a
process with the router container's arguments (``serve`` replaced by ``check --strict``). Values
helm refuses have no pod: their flags are the default pod's with these values' own set
(:func:`pod_flags`, which every successful render checks against the template). Flags added through
``router.extraArgs`` or ``router.env`` are outside the chart's checks: only ``check --strict`` sees
them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

from tests.chart import values_sets
from tests.chart.helm import Helm, RenderError, containers, flag


def drain_values(drain: int, grace: int, period: int = 5, threshold: int = 3, declared: bool = True) -> dict[str, Any]:
    probe = {"periodSeconds": period, "failureThreshold": threshold, "declareToRouter": declared}
    return {"shutdownDrainSecs": drain, "terminationGraceSecs": grace, "router": {"readinessProbe": probe}}


def health_values(
    interval: int, threshold: int, timeout: int, *, path: str | None = None, drain: int = 30, declared: bool = True
) -> dict[str, Any]:
    """The upstream health polling (the default drain, 30 s, and grace, 180 s, unless told)."""
    values = drain_values(drain, 180, declared=declared)
    values["router"].update(
        upstreamHealthPath=path,
        upstreamHealthIntervalSecs=interval,
        upstreamHealthFailureThreshold=threshold,
        upstreamHealthTimeoutSecs=timeout,
    )
    return values


def admission_values(
    limit: int | None = None,
    *,
    timeout: int | None = None,
    size: int = 256,
    engine_flag: int | None = None,
    drain: int = 30,
    declared: bool = True,
) -> dict[str, Any]:
    """``router.admission`` (the default drain, 30 s, and grace, 180 s, unless told); ``engine_flag``:
    vLLM's ``--max-num-seqs`` in ``modelServer.args``, where a null limit is taken from."""
    values = drain_values(drain, 180, declared=declared)
    values["router"]["admission"] = {"maxConcurrentRequests": limit, "queueSize": size, "queueTimeoutSecs": timeout}
    if engine_flag is not None:
        values["modelServer"] = {"args": ["--max-num-seqs", str(engine_flag)]}
    return values


#: (id, values, whether both refuse). The drain against the grace (DRAIN_CONSUMES_GRACE), against
#: the declared probe window (DRAIN_SHORTER_THAN_PROBE_WINDOW) and against the time to notice a
#: dead model server, threshold x max(interval, timeout) + timeout, never held to less than the
#: default polling's 8 s (UPSTREAM_HEALTH_SLOWER_THAN_DRAIN), on both sides of each edge.
CASES: list[tuple[str, dict[str, Any], bool]] = [
    ("defaults", {}, False),
    ("drain-just-below-grace", drain_values(179, 180), False),
    ("drain-equals-grace", drain_values(180, 180), True),
    ("drain-over-grace", drain_values(60, 30), True),
    ("ceiling-under-grace", drain_values(1800, 1802), False),
    ("ceiling-equals-grace", drain_values(1800, 1800), True),
    ("drain-equals-probe-window", drain_values(15, 180), True),
    ("drain-just-above-probe-window", drain_values(16, 180), False),
    ("drain-inside-a-longer-window", drain_values(40, 60, period=10, threshold=4), True),
    ("drain-above-a-longer-window", drain_values(41, 60, period=10, threshold=4), False),
    ("inside-window-probe-not-declared", drain_values(10, 180, declared=False), False),
    ("no-drain-probe-declared", drain_values(0, 180), True),
    ("no-drain-probe-not-declared", drain_values(0, 1, declared=False), False),
    ("both-advisories", drain_values(31, 30, period=10, threshold=4), True),
    ("health-defaults", health_values(2, 3, 2), False),
    ("health-notice-equals-drain", health_values(4, 7, 2), False),
    ("health-notice-over-drain", health_values(4, 8, 2), True),
    ("health-slow-interval", health_values(10, 3, 2), True),
    ("health-timeout-paces-the-polls", health_values(1, 3, 7), False),
    ("health-timeout-past-the-drain", health_values(1, 3, 8), True),
    ("health-threshold-one", health_values(15, 1, 15), False),
    ("health-slow-without-a-health-path", health_values(60, 10, 60, path=""), False),
    ("health-slow-with-no-drain", health_values(60, 10, 60, drain=0, declared=False), False),
    ("admission-timeout-equals-drain", admission_values(8, timeout=30), False),
    ("admission-timeout-over-drain", admission_values(8, timeout=31), True),
    ("admission-from-the-engine-flag", admission_values(engine_flag=64), False),
    ("admission-engine-flag-timeout-over-drain", admission_values(engine_flag=64, timeout=45), True),
    ("admission-no-queue-long-timeout", admission_values(8, timeout=600, size=0), False),
    ("admission-off-long-timeout", admission_values(0, timeout=600), False),
    ("admission-with-no-drain", admission_values(engine_flag=64, drain=0, declared=False), False),
    ("admission-long-timeout-with-no-drain", admission_values(8, timeout=600, drain=0, declared=False), False),
    ("admission-defaults-under-a-one-second-drain", admission_values(engine_flag=64, drain=1, declared=False), False),
    ("health-defaults-under-a-short-drain", health_values(2, 3, 2, drain=5, declared=False), False),
    ("health-as-slow-as-defaults-under-a-short-drain", health_values(3, 2, 2, drain=5, declared=False), False),
    ("health-slower-than-defaults-under-a-short-drain", health_values(3, 2, 3, drain=5, declared=False), True),
]


def pod_flags(values: dict[str, Any]) -> dict[str, str | None]:
    """The router flags these values set (``None``: the flag is absent), as the deployment template
    passes them. Checked against every render that succeeds, so it is the template's own mapping;
    for values helm refuses it says what the pod would have been given."""
    v = values_sets.merged(values)
    router = v["router"]
    probe = router["readinessProbe"]
    declared = bool(probe["declareToRouter"])
    path = router.get("upstreamHealthPath")
    path = "/health" if path is None else path  # the default engine's (vLLM's) preset
    admission = router.get("admission") or {}
    limit = admission.get("maxConcurrentRequests")
    args = v["modelServer"].get("args") or []
    if limit is None and "--max-num-seqs" in args:  # the default engine's (vLLM's) batch flag
        limit = int(args[args.index("--max-num-seqs") + 1])
    timeout = admission.get("queueTimeoutSecs")
    drain = int(v["shutdownDrainSecs"])
    timeout = (min(60, drain) if drain else 60) if timeout is None else timeout
    return {
        "--max-concurrent-requests": str(limit) if limit else None,
        "--queue-size": str(admission.get("queueSize", 256)) if limit else None,
        "--queue-timeout-secs": str(timeout) if limit else None,
        "--shutdown-drain-secs": str(v["shutdownDrainSecs"]),
        "--termination-grace-secs": str(v["terminationGraceSecs"]),
        "--readiness-probe-period-secs": str(probe["periodSeconds"]) if declared else None,
        "--readiness-probe-failure-threshold": str(probe["failureThreshold"]) if declared else None,
        "--upstream-health-path": path or None,
        "--upstream-health-interval-secs": str(router["upstreamHealthIntervalSecs"]) if path else None,
        "--upstream-health-timeout-secs": str(router["upstreamHealthTimeoutSecs"]) if path else None,
        "--upstream-health-failure-threshold": str(router["upstreamHealthFailureThreshold"]) if path else None,
    }


def with_flags(args: list[str], flags: dict[str, str | None]) -> list[str]:
    """``args`` with each of ``flags`` set to its value, or removed when ``None``."""
    out = list(args)
    for name, value in flags.items():
        if name in out:
            at = out.index(name)
            del out[at : at + 2]
        if value is not None:
            out += [name, value]
    return out


def check_strict(serve_args: list[str]) -> subprocess.CompletedProcess[str]:
    """``drain-router check --strict`` with a rendered router container's arguments."""
    assert serve_args[0] == "serve", serve_args
    clean = {k: v for k, v in os.environ.items() if not k.startswith("DRAIN_ROUTER_")}
    return subprocess.run(
        [sys.executable, "-m", "drain_router", "check", "--strict", *serve_args[1:]],
        env=clean,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(("values", "refused"), [pytest.param(v, r, id=i) for i, v, r in CASES])
def test_helm_refuses_exactly_when_check_strict_exits_1(helm: Helm, values: dict[str, Any], refused: bool) -> None:
    try:
        args = containers(helm.template(values))["router"]["args"]
        rendered = True
    except RenderError:
        # What the pod would have been given: the default pod's flags with these values' own.
        args = with_flags(containers(helm.template({}))["router"]["args"], pod_flags(values))
        rendered = False
    else:
        for name, value in pod_flags(values).items():
            assert flag(args, name) == value, f"pod_flags is not the template's mapping for {name}"
    done = check_strict(args)
    assert done.returncode in (0, 1), f"check refused the pod's flags outright: {done.stderr}"
    assert bool(json.loads(done.stdout)["advisories"]) == (done.returncode == 1)
    assert (not rendered) == (done.returncode == 1), (
        f"helm {'rendered' if rendered else 'refused'} but check --strict exited {done.returncode}: {done.stdout}"
    )
    assert (not rendered) == refused, "the table's expectation (both sides agree, but not as the table says)"
