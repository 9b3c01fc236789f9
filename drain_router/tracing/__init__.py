"""OpenTelemetry tracing (``--tracing``), off unless configured.

Rule of this package: only :mod:`drain_router.tracing.sdk` imports OpenTelemetry, and only
:func:`start` imports it, so a router or controller started without ``--tracing`` never loads the
SDK (the optional ``otel`` extra). What the rest of the code holds is a :class:`Tracer` and its
:class:`Span` s, typed here by what they are used for; what a span says (names, attributes, events)
is :mod:`drain_router.decisions.spans`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from typing import Any, Protocol

from drain_router.decisions.spans import Attributes

#: What a missing extra is answered with (the CLI exits 2 naming the flag and this).
INSTALL_HINT = "pip install 'drain-router[otel]'"


class Unavailable(Exception):
    """``--tracing`` was asked for, but the ``otel`` extra is not installed."""


class Span(Protocol):
    """An open span, as the traffic path marks it."""

    def add_event(self, name: str) -> None: ...
    def set_attribute(self, key: str, value: str | int | float | bool) -> None: ...
    def set_attributes(self, attributes: Attributes) -> None: ...
    def is_recording(self) -> bool:
        """False for a span sampled out: nothing about it is recorded or exported."""
        ...


class Tracer(Protocol):
    """The router's or controller's tracer (:class:`drain_router.tracing.sdk.Tracing`)."""

    keep_query: bool
    """``--tracing-keep-query``: spans record ``url.query`` as sent, not with its values redacted."""

    def server(self, name: str, traceparent: list[str], tracestate: list[str]) -> tuple[Span, bytes, bytes | None]:
        """A SERVER span continuing the client's W3C trace context; returns it with the
        ``traceparent`` (and ``tracestate``) that makes it the upstream request's parent. Its
        attributes are set by the caller, only when it is recording (a sampled-out request pays
        for nothing more)."""
        ...

    def end(self, span: Span, attributes: Attributes, error: str | None) -> None:
        """Set the attributes known at the end, the status, and end the span."""
        ...

    def internal(self, name: str, attributes: Attributes) -> AbstractContextManager[Span]:
        """An INTERNAL span around a block (the controller's passes); an exception marks it an error."""
        ...

    def shutdown(self) -> None:
        """Export what is queued, waiting a bounded time (never long enough to hold an exit)."""
        ...


def require() -> None:
    """Load the SDK now (at startup, so a missing extra is a clear error, not a failure later);
    raises :class:`Unavailable` without the ``otel`` extra."""
    try:
        from drain_router.tracing import sdk  # noqa: F401
    except ImportError as exc:
        raise Unavailable(f"the OpenTelemetry SDK is not installed ({exc.name}); {INSTALL_HINT}") from None


def start(service: str, on_drop: Callable[[int], None], *, keep_query: bool = False) -> Tracer:
    """The SDK set up from the standard ``OTEL_*`` variables (``service``: the ``service.name`` when
    ``OTEL_SERVICE_NAME`` does not say); ``on_drop`` counts spans dropped by a full queue;
    ``keep_query``: see :attr:`Tracer.keep_query`. Raises :class:`Unavailable` without the ``otel``
    extra."""
    require()
    from drain_router.tracing import sdk

    return sdk.Tracing(service, on_drop, keep_query=keep_query)


def event(holder: Any, name: str) -> None:
    """Add the span event ``name`` to ``holder``'s span, if it has one (a traced request, call or
    session has a ``span`` attribute; an untraced one has none). Never on the per-request path."""
    span = getattr(holder, "span", None)
    if span is not None:
        span.add_event(name)


def event_each(holders: Iterable[Any], name: str) -> None:
    """:func:`event` for each of ``holders`` (what was in flight at SIGTERM)."""
    for holder in holders:
        event(holder, name)
