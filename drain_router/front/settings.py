"""The front's own settings (the listeners', the drain's, admission's, tracing's and the logs' are the
router's :class:`~drain_router.config.Config`, validated by :func:`~drain_router.config.build_config`).
Each is declared once, as a field with its default and its :class:`~drain_router.config.flags.Flag`,
from which ``drain-router front`` builds its option (:mod:`drain_router.config.flags`)."""

from __future__ import annotations

import dataclasses

import click

from drain_router.config.flags import Flag, check_bounds, setting
from drain_router.decisions.continuation import DEFAULT_MAX_CONTINUATIONS, Dialect

NO_UPSTREAM = "http://127.0.0.1:9"
"""The router's configuration names a model server; the front has a service's pods, never this."""

DEFAULT_POLL_INTERVAL_SECS = 1
"""How often the pods' routers are probed (and, with ``--service``, the EndpointSlices read): a pod
that starts draining is left at its first ``Connection: close`` anyway, so this bounds only how soon
a new pod is used, and how soon a held request is let through."""

#: The headings of ``front --help``, in the order they are listed.
LISTENERS = "Listeners"
PODS = "Pods"
CONTINUATION = "Continuing cut streams"
HOLDING = "Admission and holding"
DRAIN = "Shutdown"
LOGS = "Logs and tracing"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class FrontSettings:
    service: str | None = setting(
        None,
        Flag(
            name="service",
            heading=PODS,
            metavar="NAMESPACE/NAME",
            help="The ModelService this front serves: its pods are the ready endpoints of its Services' "
            "EndpointSlices (the activator's left out), reached at their router's port (spec.router.port); "
            "while none is ready, requests are held and a wake is asked for on the ModelService's status. "
            "Exactly one of --service and --pods.",
        ),
    )
    """``NAMESPACE/NAME`` of the ModelService (None: ``--pods``)."""
    pods: str | None = setting(
        None,
        Flag(
            name="pods",
            heading=PODS,
            metavar="URL[,URL...]",
            help="A static list of the pods' router URLs (http://host:port), for use without Kubernetes: "
            "each is used while its /readyz answers 200. Exactly one of --service and --pods.",
        ),
    )
    """Comma-separated pod router URLs (None: ``--service``)."""
    poll_interval_secs: float = setting(
        DEFAULT_POLL_INTERVAL_SECS,
        Flag(
            name="poll-interval-secs",
            heading=PODS,
            type=click.FloatRange(min=0, min_open=True),
            metavar="SECS",
            help="How often every pod's router is probed (/readyz on its traffic port) and, with --service, "
            "the EndpointSlices listed: how soon a new pod gets traffic. A pod is left at once at its "
            "router's first Connection: close, without waiting for a probe.",
        ),
    )
    max_continuations: int = setting(
        DEFAULT_MAX_CONTINUATIONS,
        Flag(
            name="max-continuations",
            heading=CONTINUATION,
            type=click.IntRange(min=0),
            metavar="N",
            help="Continuations of one stream at most: past it, a cut stream ends with the router's "
            "honest error event. 0: never continue.",
        ),
    )
    continuation: str = setting(
        Dialect.COMPLETIONS.value,
        Flag(
            name="continuation",
            heading=CONTINUATION,
            choices=tuple(d.value for d in Dialect),
            metavar="DIALECT",
            help="How the engine can be asked to continue a cut stream, each including the one before: "
            "off (never), completions (/v1/completions with the prompt plus the text so far: every "
            "OpenAI-compatible engine), chat (also /v1/chat/completions with continue_final_message: "
            "vLLM, SGLang; not llama.cpp, which starts a new answer), token-ids (also by token ids where "
            "the engine streams them: vLLM).",
        ),
    )
    kube_api: str | None = setting(
        None,
        Flag(
            name="kube-api",
            heading=PODS,
            metavar="URL",
            help="A Kubernetes API base URL called without credentials (a stand-in). Unset: the pod's "
            "service account in a cluster, else KUBECONFIG or ~/.kube/config. Only with --service.",
        ),
    )

    def __post_init__(self) -> None:
        check_bounds(self)
        if (self.service is None) == (self.pods is None):
            raise ValueError("give exactly one of --service NAMESPACE/NAME and --pods URL[,URL...]")

    @property
    def dialect(self) -> Dialect:
        return Dialect(self.continuation.lower())

    def pod_urls(self) -> list[str]:
        """``--pods`` as a list (empty with ``--service``)."""
        return [url.strip().rstrip("/") for url in (self.pods or "").split(",") if url.strip()]

    def service_ref(self) -> tuple[str, str]:
        """``--service`` as ``(namespace, name)``; raises ``ValueError`` naming the form."""
        namespace, slash, name = (self.service or "").partition("/")
        if not slash or not namespace or not name or "/" in name:
            raise ValueError(f"--service {self.service!r}: expected NAMESPACE/NAME")
        return namespace, name
