"""One way to give a setting on the command line: its :class:`Flag`, declared once with its field
(:func:`setting`), and the click option every command builds from it (:func:`option`).

A flag is ``--<name>`` and can also come from its variable, :func:`env_name`:
``DRAIN_ROUTER_<NAME>`` for ``serve`` and ``check``, ``DRAIN_ROUTER_<COMMAND>_<NAME>`` for the other
commands (``activator``, ``controller``). Its value is either converted by click (``type``: a range,
a choice, a type of its own), its bounds then being the range's, or taken as text and parsed later
(``parse``: the router's settings, parsed by :func:`drain_router.config.build_config` so that a bad
value is refused naming its flag, its value and the remedy). No kopf here: the controller's options
are built from its settings without it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Literal

import click

from drain_router.config import usage
from drain_router.config.values import Parser

#: Every flag's variable starts with this.
ENV_PREFIX = "DRAIN_ROUTER_"

Decorator = Callable[[click.decorators.FC], click.decorators.FC]


def env_name(flag: str, command: str | None = None) -> str:
    """The variable a flag can come from: ``shutdown-drain-secs`` -> ``DRAIN_ROUTER_SHUTDOWN_DRAIN_SECS``,
    and with ``command="activator"``, ``DRAIN_ROUTER_ACTIVATOR_SHUTDOWN_DRAIN_SECS``."""
    words = flag if command is None else f"{command}-{flag}"
    return ENV_PREFIX + words.upper().replace("-", "_")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Flag:
    """How one setting is given: ``--<name>`` (``--<name>/--no-<name>`` for a ``switch``) or its
    variable (:func:`env_name`)."""

    name: str
    help: str
    heading: str | None = None
    """The heading it is listed under in ``--help`` (None: the command's; the router's settings are
    listed under their section's)."""
    metavar: str | None = None
    kind: Literal["value", "switch", "flag", "repeated"] = "value"
    """``switch``: a boolean with its ``--no-`` form; ``flag``: a boolean given by the flag alone;
    ``repeated``: given once per value (its variable takes a space-separated list)."""
    type: click.ParamType[Any] | None = None
    """What click converts the value to, and its bounds (a range); None: the text as given."""
    choices: tuple[str, ...] | None = None
    """The only values taken, matched ignoring case unless ``case_sensitive``."""
    case_sensitive: bool = False
    parse: Parser | None = None
    """The router's settings: the parser :func:`drain_router.config.build_config` reads the text with."""
    cli_default: Any = None
    """The command's default where it differs from the field's (which library callers and tests get)."""
    show_default: bool = True
    """``--help`` shows the default (never for a ``flag`` or a ``repeated`` option, nor a None)."""

    @property
    def key(self) -> str:
        """The parameter's name: ``--grpc-port`` -> ``grpc_port`` (the keyword of
        :func:`drain_router.config.build_config` and the ``field`` of a ``ConfigError``)."""
        return self.name.replace("-", "_")

    def click_type(self) -> click.ParamType[Any] | None:
        if self.choices is not None:
            return click.Choice(self.choices, case_sensitive=self.case_sensitive)
        return self.type

    def out_of_bounds(self, value: Any) -> str | None:
        """Why ``value`` is outside this flag's range (None: inside, or no range), as the settings'
        own checks say it: ``must be at least 1``, ``must be more than 0``, ``must be a port (0-65535)``."""
        bounds = self.type
        if value is None or not isinstance(bounds, (click.IntRange, click.FloatRange)):
            return None
        low, high = bounds.min, bounds.max
        below = low is not None and (value <= low if bounds.min_open else value < low)
        above = high is not None and (value >= high if bounds.max_open else value > high)
        if not (below or above):
            return None
        if low is not None and high is not None:
            return f"must be a port ({low}-{high})" if self.metavar == "PORT" else f"must be between {low} and {high}"
        if low is not None:
            return f"must be more than {low}" if bounds.min_open else f"must be at least {low}"
        return f"must be less than {high}" if bounds.max_open else f"must be at most {high}"


def setting(default: Any, flag: Flag) -> Any:
    """A dataclass field with its flag (``dataclasses.MISSING`` as default: the flag is required)."""
    if default is dataclasses.MISSING:
        return dataclasses.field(metadata={"flag": flag})
    return dataclasses.field(default=default, metadata={"flag": flag})


def fields(cls: type[Any]) -> Iterator[tuple[dataclasses.Field[Any], Flag]]:
    """The fields of dataclass ``cls`` that a flag sets, with their flags, in declaration order."""
    for field in dataclasses.fields(cls):
        if "flag" in field.metadata:
            yield field, field.metadata["flag"]


def check_bounds(settings: Any) -> None:
    """Raise ValueError (``--<flag> must be ...``) for the first field of ``settings`` outside its
    flag's range: what click refuses on the command line, refused to library callers too."""
    for field, flag in fields(type(settings)):
        problem = flag.out_of_bounds(getattr(settings, field.name))
        if problem is not None:
            raise ValueError(f"--{flag.name} {problem}")


def _text(default: Any) -> str | None:
    """A default as a user would write it (a list comma-separated), for a flag read as text."""
    if default is None:
        return None
    return ",".join(default) if isinstance(default, tuple) else str(default)


def option(
    flag: Flag, default: Any, *, command: str | None = None, name: str | None = None, heading: str | None = None
) -> Decorator[Any]:
    """The click option of a setting: flag, variable, type, metavar, default, help and heading come
    from ``flag`` and the field's ``default`` (``dataclasses.MISSING``: required), said once where the
    setting is declared. ``command``: whose variable (:func:`env_name`); ``name``: the parameter's
    (default :attr:`Flag.key`); ``heading``: where the flag declares none."""
    if flag.cli_default is not None:
        default = flag.cli_default
    attrs: dict[str, Any] = {
        "envvar": env_name(flag.name, command),
        "show_envvar": True,
        "help": flag.help,
        "heading": flag.heading or heading or usage.OTHER_OPTIONS,
        "metavar": flag.metavar,
        "type": flag.click_type(),
    }
    decl = f"--{flag.name}"
    if flag.kind == "switch":
        decl = f"--{flag.name}/--no-{flag.name}"
        attrs.update(default=bool(default), show_default=flag.show_default)
    elif flag.kind == "flag":
        attrs.update(is_flag=True, default=default, show_default=False)
    elif flag.kind == "repeated":
        attrs.update(multiple=True, default=default, show_default=False)
    elif default is dataclasses.MISSING:
        attrs.update(required=True)
    else:
        if flag.parse is not None:
            default = _text(default)
        attrs.update(default=default, show_default=flag.show_default and default is not None)
    return usage.option(decl, name or flag.key, **attrs)


def options(decorators: Iterable[Decorator[Any]]) -> Decorator[Any]:
    """One decorator applying ``decorators`` so that ``--help`` lists them in the order given."""
    ordered = list(decorators)

    def apply(func: Any) -> Any:
        for decorator in reversed(ordered):
            func = decorator(func)
        return func

    return apply


def settings_options(cls: type[Any], *, command: str | None = None) -> Decorator[Any]:
    """The options of every field of dataclass ``cls`` that a flag sets, in declaration order; each
    parameter is named by its field."""
    return options(option(flag, field.default, command=command, name=field.name) for field, flag in fields(cls))
