"""How a command's ``--help`` lists its options, one layout for every subcommand that has settings
(``serve``, ``check``, ``controller``): each option under a heading, and each value named by what it
takes (``PORT``, ``SECS``, ``N``, ...), never by click's type names (``INTEGER RANGE``).

An option declares its heading once, where it is declared (:func:`option`, or ``cls=HeadedOption,
heading=...`` for :func:`click.option`); :class:`SectionedCommand` lists the headings in the order
their first option comes, and the options without one (``--help``) last, under :data:`OTHER_OPTIONS`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

#: The heading of options that declare none (``--help``, ``--version``), listed last.
OTHER_OPTIONS = "Other options"

#: click's own names for a value: they say the type, not what the value is (a port, seconds, a
#: count). No option of the command line shows one; an option declares a metavar instead.
GENERIC_METAVARS = frozenset({"TEXT", "INTEGER", "FLOAT", "BOOLEAN", "INTEGER RANGE", "FLOAT RANGE"})


class HeadedOption(click.Option):
    """A click option listed under ``heading`` in its command's ``--help``."""

    def __init__(self, *args: Any, heading: str = OTHER_OPTIONS, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.heading = heading


def option(*decls: str, heading: str, **attrs: Any) -> Callable[[click.decorators.FC], click.decorators.FC]:
    """:func:`click.option` for an option listed under ``heading``."""
    return click.option(*decls, cls=HeadedOption, heading=heading, **attrs)


def heading_of(param: click.Parameter) -> str:
    """The heading ``param`` is listed under."""
    return getattr(param, "heading", OTHER_OPTIONS)


class SectionedCommand(click.Command):
    """A command whose options are listed under their headings, :data:`OTHER_OPTIONS` last."""

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        groups: dict[str, list[tuple[str, str]]] = {}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is not None:
                groups.setdefault(heading_of(param), []).append(record)
        other = groups.pop(OTHER_OPTIONS, [])
        for title, records in [*groups.items(), *([(OTHER_OPTIONS, other)] if other else [])]:
            with formatter.section(title):
                formatter.write_dl(records)
