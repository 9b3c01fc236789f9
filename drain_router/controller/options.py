"""How a controller setting is given on the command line: its flag, click type, metavar, help and
heading (:class:`Option`), declared with its field (:func:`setting`). ``drain-router controller``
builds its options from these, listed under headings as ``serve`` lists its own
(:mod:`drain_router.config.usage`). No kopf here.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

import click

#: The headings of ``controller --help``, in the order they are listed.
WATCH = "What to watch"
DELETION = "Staged deletion"
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
