"""How a controller setting is given on the command line: its flag, click type, metavar, help and
heading (:class:`Option`), declared with its field (:func:`setting`). ``drain-router controller``
builds its options from these, listed under headings as ``serve`` lists its own
(:mod:`drain_router.config.usage`). No kopf here.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

import click

from drain_router.decisions import route_switch

#: The headings of ``controller --help``, in the order they are listed.
WATCH = "What to watch"
DELETION = "Staged deletion"
WAKING = "Scale to zero and wake on a request"
LEADER_ELECTION = "Leader election"
ENDPOINTS = "Metrics and liveness"
LOGGING = "Logging"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Option:
    """How a setting is given to ``drain-router controller``: ``--<flag>`` (``--<flag>/--no-<flag>``
    for a ``switch``) or ``DRAIN_ROUTER_CONTROLLER_<FLAG>``."""

    flag: str
    help: str
    heading: str
    """The heading it is listed under in ``--help``."""
    type: click.ParamType[Any] | None = None
    metavar: str | None = None
    kind: Literal["value", "switch", "flag", "repeated"] = "value"
    """``switch``: a boolean with its ``--no-`` form; ``flag``: a boolean given by the flag alone;
    ``repeated``: given once per value (its variable takes a space-separated list)."""
    cli_default: Any = None
    """The command's default where it differs from the field's (which library callers and tests get)."""
    show_default: bool = True
    """``--help`` shows the default (never for a ``flag`` or a ``repeated`` option)."""

    @property
    def envvar(self) -> str:
        return "DRAIN_ROUTER_CONTROLLER_" + self.flag.upper().replace("-", "_")


def setting(default: Any, option: Option) -> Any:
    """A dataclass field that the command line sets, through ``option``."""
    return dataclasses.field(default=default, metadata={"option": option})


class ActivatorServiceType(click.ParamType[Any]):
    """``<namespace>/<name>:<port>[,<grpcPort>]`` -> :class:`route_switch.ActivatorService`; anything else is a usage
    error naming the value and the expected form."""

    name = "NS/NAME:PORT[,GRPC_PORT]"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if value is None or isinstance(value, route_switch.ActivatorService):
            return value
        try:
            return route_switch.parse_activator_service(str(value))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


ACTIVATOR_SERVICE = Option(
    flag="activator-service",
    heading=WAKING,
    type=ActivatorServiceType(),
    metavar="NS/NAME:PORT[,GRPC_PORT]",
    show_default=False,
    help="The activator's Service (drain-router activator), and its gRPC port if it has one (a GRPCRoute "
    "points there; without it, at PORT). Given, a ScaleToZero rule first points the "
    "ModelService's route at it (every rule's backendRefs, with a header naming the ModelService) and only "
    "then scales the Deployment to 0; a request arriving while asleep is held by the activator, which asks "
    "for a wake; the controller scales the Deployment back and points the route back once a pod's router "
    "answers ready. Not given: ScaleToZero keeps the route, and a sleeping service wakes only when a "
    "person scales it up.",
)
