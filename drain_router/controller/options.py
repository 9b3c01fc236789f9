"""What the controller's settings need to be given on the command line beyond
:mod:`drain_router.config.flags` (each a :class:`~drain_router.config.flags.Flag` declared with its
field in :mod:`.settings`): the headings of ``controller --help``, the types of the activator's flags
and the flags. No kopf here.
"""

from __future__ import annotations

from typing import Any

import click

from drain_router.config.flags import Flag
from drain_router.decisions import service_ports, wake_endpoints

#: The headings of ``controller --help``, in the order they are listed.
WATCH = "What to watch"
DELETION = "Staged deletion"
WAKING = "Scale to zero and wake on a request"
LEADER_ELECTION = "Leader election"
ENDPOINTS = "Metrics and liveness"
LOGGING = "Logging"


class ActivatorServiceType(click.ParamType[Any]):
    """``<namespace>/<name>`` -> :class:`wake_endpoints.ActivatorService` (the old ``:<port>[,<grpcPort>]``
    suffix accepted and ignored); anything else is a usage error naming the value and the expected form."""

    name = "NS/NAME"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if value is None or isinstance(value, wake_endpoints.ActivatorService):
            return value
        try:
            return wake_endpoints.parse_activator_service(str(value))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


class PortRangeType(click.ParamType[Any]):
    """``FIRST-LAST`` -> ``range``; anything else is a usage error saying what is wrong."""

    name = "FIRST-LAST"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, range):
            return value
        try:
            return service_ports.parse_range(str(value))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


ACTIVATOR_SERVICE = Flag(
    name="activator-service",
    heading=WAKING,
    type=ActivatorServiceType(),
    metavar="NS/NAME",
    show_default=False,
    help="The activator's Service (drain-router activator). Given, a ScaleToZero rule first makes the "
    "activator's pods endpoints of the ModelService's Services (an EndpointSlice per Service, on ports "
    "the activator opens for that service alone, recorded in the ConfigMap NAME-ports in NS) and only "
    "once those read back ready scales the Deployment to 0; a request arriving while asleep is held by "
    "the activator, which asks for a wake; the controller scales the Deployment back and removes the "
    "activator's endpoints once a pod is Ready and its router serves. The user's routes and Services are "
    "never written. Not given: ScaleToZero leaves the Services without endpoints, and a sleeping "
    "service wakes only when a person scales it up. An old ':PORT[,GRPC_PORT]' suffix is ignored "
    "(logged as deprecated).",
)
ACTIVATOR_PORTS = Flag(
    name="activator-ports",
    heading=WAKING,
    type=PortRangeType(),
    metavar="FIRST-LAST",
    cli_default=f"{service_ports.DEFAULT_PORTS.start}-{service_ports.DEFAULT_PORTS.stop - 1}",
    help="The activator ports assigned to sleeping services, one per service and protocol (http, grpc), "
    "inclusive. A service keeps its ports while its ModelService exists: size the range for twice the "
    "services that may sleep; a service that finds no free port is not put to sleep. Must be open "
    "between the clients and the activator's pods.",
)
ACTIVATOR_ADMIN_PORT = Flag(
    name="activator-admin-port",
    heading=WAKING,
    type=click.IntRange(1, 65535),
    metavar="PORT",
    help="The activator pods' admin port: GET /admin/ports there says which ports a pod listens on, and "
    "only a pod that listens on a service's ports becomes its endpoint (the chart's activator.adminPort).",
)
