"""A command that runs the router's traffic path with settings of its own beside the router's
(``activator``, ``front``): its options, built from both (:class:`CommandOptions`), and the values
given split back into the router's :class:`~drain_router.config.Config` and its own settings, a bad
value refused naming its flag (:meth:`CommandOptions.split`)."""

from __future__ import annotations

import dataclasses
from typing import Any

import click

from drain_router import config
from drain_router.config import flags


class CommandOptions:
    """The options of ``command`` (its variables ``DRAIN_ROUTER_<COMMAND>_<FLAG>``): the router's
    settings it takes, and every one of ``own`` (a settings dataclass of :func:`flags.setting` fields)."""

    def __init__(self, command: str, own: type[Any], *, no_upstream: str, case_sensitive: bool = False) -> None:
        self.command = command
        self.own = own
        self.no_upstream = no_upstream
        """The router's configuration names a model server; such a command has others, never this."""
        self.case_sensitive = case_sensitive
        self.router_flags = {flag.name: (field, flag) for _, field, flag in config.settings()}
        self.own_flags = {flag.name: (field, flag) for field, flag in flags.fields(own)}

    def router(self, name: str, heading: str, help: str | None = None) -> flags.Decorator[Any]:
        """The option of the router's setting ``--<name>``: its default, metavar and parser are the
        router's (:func:`~drain_router.config.build_config` reads it), its heading and help (when
        given) the command's."""
        field, flag = self.router_flags[name]
        ours = dataclasses.replace(
            flag,
            heading=heading,
            help=flag.help if help is None else help,
            case_sensitive=self.case_sensitive or flag.case_sensitive,
        )
        return flags.option(ours, field.default, command=self.command)

    def mine(self, name: str) -> flags.Decorator[Any]:
        """The option of the command's own setting ``--<name>``, all of it declared with its field."""
        field, flag = self.own_flags[name]
        return flags.option(flag, field.default, command=self.command, name=field.name)

    def split(self, given: dict[str, Any]) -> tuple[config.Config, Any]:
        """The values given, as the router's Config and the command's own settings; a bad value exits
        2 naming its flag (click's ``BadParameter``, or ``UsageError`` for a check across flags)."""
        own = {field.name: given.pop(field.name) for field, _ in self.own_flags.values()}
        try:
            cfg = config.build_config(upstream=self.no_upstream, **given)
        except config.ConfigError as exc:
            raise click.BadParameter(
                f"{exc.value!r}: {exc.reason}", param_hint=f"'{config.flag_name(exc.field)}'"
            ) from None
        try:
            settings = self.own(**own)
        except ValueError as exc:
            raise click.UsageError(str(exc)) from None
        return cfg, settings
