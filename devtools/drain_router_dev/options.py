"""Command-line options of the tools' own commands (``demo``, ``fake-model``) made from settings dataclasses.

A tool's settings dataclass declares each default once; its option takes the default from the field
rather than repeating it, so ``--help`` and a run without the flag agree with the dataclass.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import click


def field_option(settings: type[Any], name: str, **attrs: Any) -> Callable[[click.decorators.FC], click.decorators.FC]:
    """``--name`` (underscores as dashes) for the field ``name`` of the dataclass ``settings``, with the
    field's default, shown in the help; ``attrs`` are the rest of :func:`click.option`'s arguments."""
    field = {f.name: f for f in dataclasses.fields(settings)}[name]
    if field.default is dataclasses.MISSING:
        raise TypeError(f"{settings.__name__}.{name} has no default to offer")
    return click.option(f"--{name.replace('_', '-')}", name, default=field.default, show_default=True, **attrs)
