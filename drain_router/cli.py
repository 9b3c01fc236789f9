"""The ``drain-router`` command line. It only translates: flags -> :func:`config.build_config` -> run.

Every flag of ``serve`` and ``check`` can also come from ``DRAIN_ROUTER_<FLAG_IN_CAPS>`` (for example
``DRAIN_ROUTER_SHUTDOWN_DRAIN_SECS=60``). Exit status: 0 clean, 1 deadline aborted requests (for
``check --strict``: an advisory is active), 2 configuration error.
"""

from __future__ import annotations

import importlib
import json
import sys
from typing import Any

import click

from drain_router import config, early_signals
from drain_router.config import flags, usage

#: Subcommands that live in other packages, imported only when invoked, so ``serve`` never loads kopf.
#: Each description is the first line of the command's own help (a test keeps them equal); None:
#: ``drain-router --help`` takes it from the command itself. The development tools (the fake model
#: server, the demo) are another distribution's command, ``drain-router-dev``.
LAZY_COMMANDS: dict[str, tuple[str, str | None]] = {
    "controller": (
        "drain_router.controller.command",
        "Run the companion controller: staged deletion of ModelServices (needs the 'controller' extra).",
    ),
    "activator": (
        "drain_router.activator.command",
        "Hold the requests of ModelServices scaled to zero, ask for a wake, forward them once ready.",
    ),
    "front": (
        "drain_router.front.command",
        "Front one service's pods: spread, retry refusals, hold, continue cut streams on another pod.",
    ),
}


class LazyGroup(click.Group):
    """A click group whose listed subcommands are imported on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted([*super().list_commands(ctx), *LAZY_COMMANDS])

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in LAZY_COMMANDS:
            module_name, _ = LAZY_COMMANDS[cmd_name]
            command = importlib.import_module(module_name).command
            assert isinstance(command, click.Command)
            return command
        return super().get_command(ctx, cmd_name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # Describe lazy commands without importing them (help must not need kopf), but those without
        # a description here.
        rows = [(name, cmd.get_short_help_str(60)) for name, cmd in self.commands.items()]
        for name, (_, help_) in LAZY_COMMANDS.items():
            if help_ is None:
                command = self.get_command(ctx, name)
                assert command is not None
                help_ = command.get_short_help_str(100)
            rows.append((name, help_))
        with formatter.section("Commands"):
            formatter.write_dl(sorted(rows))


#: The options of ``serve`` and ``check``: one per setting of the configuration tree, listed as
#: :func:`config.settings` orders them under :func:`config.help_title`. Values stay text here;
#: :func:`config.build_config` parses them.
router_options = flags.options(
    flags.option(flag, field.default, heading=config.help_title(section, flag))
    for section, field, flag in config.settings()
)


def _build(params: dict[str, Any]) -> config.Config:
    try:
        return config.build_config(**params)
    except config.ConfigError as exc:
        # click prints "Error: Invalid value for '--flag': ..." and exits 2. A value that came from
        # the environment is named by its variable, the one the user has to change.
        flag = config.flag_name(exc.field)
        hint = f"'{flag}'"
        if click.get_current_context().get_parameter_source(exc.field) is click.core.ParameterSource.ENVIRONMENT:
            hint = f"'{config.env_name(flag[2:])}' (the variable of {hint})"
        value = "not given" if exc.value is None else repr(exc.value)
        raise click.BadParameter(f"{value}: {exc.reason}", param_hint=hint) from None


def _require_tracing(on: bool, flag: str) -> None:
    """``--tracing`` without the ``otel`` extra: exit 2 with the remedy (the SDK loads only when on)."""
    if on:
        from drain_router import tracing

        try:
            tracing.require()
        except tracing.Unavailable as exc:
            click.echo(f"Error: {flag}: {exc}", err=True)
            sys.exit(2)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="drain-router")
@click.pass_context
def main(ctx: click.Context) -> None:
    """drain-router: lossless pod termination for LLM model servers on Kubernetes."""
    if ctx.invoked_subcommand not in ("serve", "activator"):
        early_signals.release()  # only serve and activator drain; the others get the default signal handling


@main.command(cls=usage.SectionedCommand)
@router_options
def serve(**params: Any) -> None:
    """Run the draining reverse proxy in front of a model server."""
    # The entry point has recorded terminating signals since the process started (installed again
    # here for callers that did not come through it); the lifecycle replays them on its loop.
    early_signals.install()
    cfg = _build(params)
    from drain_router import logs
    from drain_router.runtime import lifecycle  # the event loop, httptools and aiohttp only when serving

    _require_tracing(cfg.log.tracing, "--tracing")
    logs.configure(format=cfg.log.format, level=cfg.log.level)
    sys.exit(lifecycle.serve(cfg, pending_signals=early_signals.pending))


@main.command(cls=usage.SectionedCommand)
@router_options
@click.option(
    "--strict",
    is_flag=True,
    default=False,
    envvar=config.env_name("strict"),
    show_envvar=True,
    help="Exit 1 when any advisory is active (the JSON is printed all the same): a CI gate that "
    "refuses a configuration which starts but would lose requests or cut streams at the next "
    "rollout, as the Helm chart refuses the same values.",
)
def check(strict: bool, **params: Any) -> None:
    """Print the effective configuration and advisories as JSON; exit 0, 1 with --strict and an
    advisory, or 2 on a hard error."""
    cfg = _build(params)
    effective = config.effective(cfg)
    click.echo(json.dumps(effective, indent=2, sort_keys=True))
    if strict and effective["advisories"]:
        sys.exit(1)
