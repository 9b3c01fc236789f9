"""What the controller's settings need to be given on the command line beyond
:mod:`drain_router.config.flags` (each a :class:`~drain_router.config.flags.Flag` declared with its
field in :mod:`.settings`): the headings of ``controller --help``, the type of ``--activator-service``
and its flag. No kopf here.
"""

from __future__ import annotations

from typing import Any

import click

from drain_router.config.flags import Flag
from drain_router.decisions import route_switch

#: The headings of ``controller --help``, in the order they are listed.
WATCH = "What to watch"
DELETION = "Staged deletion"
WAKING = "Scale to zero and wake on a request"
LEADER_ELECTION = "Leader election"
ENDPOINTS = "Metrics and liveness"
LOGGING = "Logging"


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


ACTIVATOR_SERVICE = Flag(
    name="activator-service",
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
