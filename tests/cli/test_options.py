"""Every command builds its options from its settings one way (:mod:`drain_router.config.flags`):
each option's variable is the one :func:`~drain_router.config.flags.env_name` gives, and the
activator takes its defaults and bounds from the settings' declarations instead of restating them."""

from __future__ import annotations

import dataclasses
import re

import click
import pytest

from drain_router import cli, config
from drain_router.activator.settings import ActivatorSettings
from drain_router.config import flags

#: Each command with settings, and the word its variables carry after ``DRAIN_ROUTER_``.
COMMANDS = {"serve": None, "check": None, "activator": "activator", "controller": "controller"}


def _options(name: str) -> list[click.Option]:
    top = click.Context(cli.main, info_name="drain-router")
    command = cli.main.get_command(top, name)
    assert command is not None, name
    return [param for param in command.params if isinstance(param, click.Option)]


def test_the_rule_of_a_variables_name() -> None:
    assert flags.env_name("shutdown-drain-secs") == "DRAIN_ROUTER_SHUTDOWN_DRAIN_SECS"
    assert flags.env_name("queue-size", "activator") == "DRAIN_ROUTER_ACTIVATOR_QUEUE_SIZE"
    assert flags.env_name("leader-election-lease", "controller") == "DRAIN_ROUTER_CONTROLLER_LEADER_ELECTION_LEASE"


@pytest.mark.parametrize("name", COMMANDS)
def test_every_option_has_the_variable_the_one_rule_names(name: str) -> None:
    """The rule was written three times (serve's, the activator's, the controller's); now every
    option's variable, ``check --strict`` included, is what :func:`flags.env_name` says, and only
    ``controller --print-crd`` (an action, not a setting) has none."""
    options = _options(name)
    wrong = [
        (option.opts[0], option.envvar)
        for option in options
        if option.envvar is not None and option.envvar != flags.env_name(option.opts[0][2:], COMMANDS[name])
    ]
    assert wrong == []
    without = [option.opts[0] for option in options if option.envvar is None]
    assert without == (["--print-crd"] if name == "controller" else [])


def test_the_activators_router_options_take_the_routers_defaults() -> None:
    """--host, --shutdown-drain-secs, --log-level, ...: the router's setting's default as its text,
    and its parser (build_config reads them), never a copy."""
    router = {flag.key: field.default for _, field, flag in config.settings()}
    own = {field.name: field.default for field, _ in flags.fields(ActivatorSettings)}
    options = {option.name: option for option in _options("activator")}
    taken = set(options) - set(own)
    assert taken == {
        "host",
        "admin_host",
        "admin_port",
        "shutdown_drain_secs",
        "termination_grace_secs",
        "log_level",
        "log_format",
    }
    assert taken <= set(router)
    for name in taken:
        default = router[name]
        assert options[name].default == (None if default is None else str(default)), name
    for name, default in own.items():
        assert options[name].default == default, name


def test_the_activators_own_bounds_are_its_flags() -> None:
    """One declaration of each bound: the click range of the option is the flag's, and the settings
    refuse the values the option refuses, with the messages they gave."""
    options = {option.name: option for option in _options("activator")}
    for field, flag in flags.fields(ActivatorSettings):
        if flag.type is not None:
            assert options[field.name].type is flag.type, field.name
    refused = {
        "queue_size": (0, "--queue-size must be at least 1"),
        "activation_timeout_secs": (0, "--activation-timeout-secs must be at least 1"),
        "max_services": (0, "--max-services must be at least 1"),
        "poll_interval_secs": (0, "--poll-interval-secs must be more than 0"),
    }
    for name, (value, message) in refused.items():
        with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
            ActivatorSettings(**{name: value})
    edges = ActivatorSettings(queue_size=1, activation_timeout_secs=1, max_services=1, poll_interval_secs=0.001)
    assert dataclasses.replace(edges, max_services=1).max_services == 1
