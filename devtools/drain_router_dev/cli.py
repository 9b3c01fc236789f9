"""``drain-router-dev``: the development tools' command line (``fake-model``, ``demo``)."""

from __future__ import annotations

import importlib

import click

#: Each command is imported only when invoked: ``demo --help`` needs no gRPC library.
COMMANDS = {
    "fake-model": "drain_router_dev.fake_model",
    "demo": "drain_router_dev.demo",
    "cluster": "drain_router_dev.kube.cli",
}


class _Lazy(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in COMMANDS:
            return None
        command = importlib.import_module(COMMANDS[cmd_name]).command
        assert isinstance(command, click.Command)
        return command


@click.group(cls=_Lazy, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
def main() -> None:
    """drain-router's development tools: a stand-in model server and the rolling-restart demo.
    Not for a cluster: the product is ``drain-router``."""
