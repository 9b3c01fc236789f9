"""The ways a pod can end that the demo and the e2e suite compare, as pods on this machine: three
recipes, the sleep recipe behind two balancers, so four runs (:data:`LABELS`).

- **drain-router**: ``drain-router serve --shutdown-drain-secs D`` in front of the model server. At
  t0 the router gets SIGTERM, its ``/readyz`` says 503 at once and it keeps serving for D s, then
  finishes its streams (:class:`RouterPod`).
- **preStop sleep + engine drain** (KServe v0.19's recipe, also in vLLM's and llm-d's guides): no
  router. At t0 the kubelet runs a preStop ``sleep 15``; then the engine gets SIGTERM and drains
  with ``--shutdown-timeout = grace - 15`` (KServe: grace 60 s, timeout 45 s) (:class:`EnginePod`).
- **no drain**: the router with ``--shutdown-drain-secs 0``: SIGTERM goes straight to closing. With
  realtime sessions it is not told the pod's grace and closes no session (``--websocket-close-at
  deadline`` without a deadline), and the demo SIGKILLs it at the grace as the kubelet does: its open
  sessions end 1006, as a server's without a drain do.

The pods themselves, and how the balancer learns that one is going, are :mod:`drain_router_dev.pods`.
Kubernetes windows are scaled to the demo's: :func:`scaled_sleep_recipe`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

from drain_router.config import DrainSettings
from drain_router_dev import cluster
from drain_router_dev.pods import EnginePod, Pod, RouterPod, SleepRecipe

#: KServe v0.19's preStop sleep and pod grace, in seconds (kserve/kserve PRs 5485 and 5496).
KSERVE_PRESTOP_SLEEP_SECS = 15
KSERVE_GRACE_SECS = 60
#: The router's default ``--shutdown-drain-secs``: the real-world size a scaled drain stands for.
ROUTER_DEFAULT_DRAIN_SECS = DrainSettings().shutdown_drain_secs


def scaled_sleep_recipe(drain_secs: float) -> SleepRecipe:
    """KServe's windows scaled as the run scales the router's: a drain of ``drain_secs`` stands for
    the default 30 s, so the 15 s sleep and the 60 s grace shrink by the same factor. Pure."""
    scale = drain_secs / ROUTER_DEFAULT_DRAIN_SECS
    sleep = KSERVE_PRESTOP_SLEEP_SECS * scale
    return SleepRecipe(prestop_sleep_secs=sleep, shutdown_timeout_secs=KSERVE_GRACE_SECS * scale - sleep)


@dataclasses.dataclass(frozen=True, slots=True)
class Recipe:
    label: str
    setting: str
    window_secs: float
    """How long a pod's termination lasts before its streams' tail: for the progress bar."""
    pods: Callable[[Path], list[Pod]]
    """Builds the run's pods, their logs under the given directory."""
    note: str = ""
    t0_name: str = "SIGTERM"
    closing_name: str = "closing"
    probe_name: str = "router /readyz"


#: The label of the sleep recipe behind a balancer that probes only the engine.
PROBE_ONLY_LABEL = "sleep (probe-only LB)"

#: The runs :func:`compared` returns, by label, in order: the columns of the demo's table.
LABELS = ("drain-router", "sleep + engine drain", PROBE_ONLY_LABEL, "no drain")

_NUMBERS = {2: "two", 3: "three", 4: "four", 5: "five", 6: "six"}


def how_many() -> str:
    """The number of runs the demo compares, in words (``four``), for its help."""
    return _NUMBERS.get(len(LABELS), str(len(LABELS)))


def compared(
    model_url: str,
    *,
    replicas: int,
    drain_secs: int,
    chunks: int,
    interval_ms: int,
    termination_grace_secs: int | None = None,
    grpc_url: str | None = None,
) -> list[Recipe]:
    """The runs the demo compares, each on ``replicas`` pods: drain-router, sleep + engine drain,
    the same sleep recipe behind a balancer that probes only the engine (the e2e's case where
    drain-router wins against it), and no drain. The router pods share the model server at
    ``model_url``, each engine pod runs its own. ``termination_grace_secs`` is declared on the
    routers (their in-flight deadline: where realtime sessions get 1001), but for no drain: its
    routers close no session and are SIGKILLed at that grace. With ``grpc_url`` (the
    shared model server's gRPC endpoint) every pod takes gRPC calls too: the routers relay them
    there, each engine serves them on its own gRPC port."""
    sleep = scaled_sleep_recipe(drain_secs)
    names = [f"pod-{i}" for i in range(replicas)]

    def routers(drain: int, *, closes_sessions: bool = True) -> Callable[[Path], list[Pod]]:
        extra: tuple[str, ...] = ()
        if closes_sessions or termination_grace_secs is None:
            grace, kill_after = termination_grace_secs, None
        else:  # no drain: nothing tells a session to go; the kubelet's SIGKILL at the grace cuts it
            grace, kill_after = None, termination_grace_secs
            extra = ("--websocket-close-at", "deadline")
        return lambda logs: [
            RouterPod(
                cluster.Replica(
                    n,
                    model_url,
                    logs,
                    shutdown_drain_secs=drain,
                    termination_grace_secs=grace,
                    grpc_upstream=grpc_url,
                    extra_args=extra,
                ),
                kill_after_secs=kill_after,
            )
            for n in names
        ]

    def engines(sees_deletion: bool) -> Callable[[Path], list[Pod]]:
        return lambda logs: [
            EnginePod(
                n,
                logs,
                sleep,
                chunks=chunks,
                interval_ms=interval_ms,
                balancer_sees_deletion=sees_deletion,
                grpc=grpc_url is not None,
            )
            for n in names
        ]

    sleep_setting = (
        f"preStop sleep {sleep.prestop_sleep_secs:g} s, --shutdown-timeout {sleep.shutdown_timeout_secs:g} s"
    )
    engine_marks = {"t0_name": "pod deleted: preStop sleep", "closing_name": "engine SIGTERM"}
    router, sleep_lb, probe_only, no_drain = LABELS
    return [
        Recipe(router, f"--shutdown-drain-secs {drain_secs}", drain_secs, routers(drain_secs)),
        Recipe(
            sleep_lb,
            sleep_setting,
            sleep.prestop_sleep_secs,
            engines(True),
            note=f"KServe's sleep 15 s and timeout 60 - 15 s, scaled by {drain_secs}/30; no router; the "
            "balancer is told of the pod's deletion; SIGTERM to exit counts from the sleep's start",
            probe_name="pod readiness",
            **engine_marks,
        ),
        Recipe(
            probe_only,
            sleep_setting,
            sleep.prestop_sleep_secs,
            engines(False),
            note="the same recipe behind a balancer that probes only the engine's /health, as one that "
            "health-checks pod addresses without watching the API does: nothing tells it of the deletion, "
            "so it keeps sending until the engine's SIGTERM closes the listener and its probe fails",
            probe_name="engine /health",
            **engine_marks,
        ),
        Recipe(
            no_drain,
            "--shutdown-drain-secs 0",
            0,
            routers(0, closes_sessions=False),
            note=""
            if termination_grace_secs is None
            else "no session is told to go: --websocket-close-at deadline and no grace declared; SIGKILL "
            f"at the pod's grace, {termination_grace_secs} s, cuts the ones still open",
        ),
    ]
