"""Every write the controller can make to a user's object goes through the ownership rule: the API
client's write methods take a :class:`ownership.Consent`, and consents are made in one module only.
A new write method without one, or a consent built anywhere else, fails here."""

from __future__ import annotations

import ast
import inspect
import pathlib
import typing

from drain_router.controller.kube import client as kube_
from drain_router.decisions import ownership

PACKAGE = pathlib.Path(kube_.__file__).resolve().parents[2]  # drain_router/
OWN_OBJECTS = {"patch_modelservice_status", "write_configmap", "put_networkpolicy", "delete_networkpolicy"}
"""Writes to the controller's own objects: the ModelService's status, and in the activator's namespace
the port map and the NetworkPolicies (labelled ``managed-by: drain-router.dev``)."""
WRITE_VERBS = {"DELETE", "PATCH", "POST", "PUT"}


def _writes(method: typing.Any) -> bool:
    """Whether a method's body sends a write: a ``_call`` with a write verb, or ``_delete``."""
    tree = ast.parse(inspect.cleandoc("\n" + inspect.getsource(method)))
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr == "_delete":
                return True
            if node.func.attr == "_call" and any(
                isinstance(a, ast.Constant) and a.value in WRITE_VERBS for a in node.args
            ):
                return True
    return False


def test_every_write_method_takes_a_consent() -> None:
    writers = [
        name
        for name, method in inspect.getmembers(kube_.Kube, inspect.iscoroutinefunction)
        if not name.startswith("_") and _writes(method)
    ]
    assert {"delete", "force_delete_pod", "evict_pod", "scale", "patch", "delete_modelservice", "create"} <= set(
        writers
    )
    for name in writers:
        if name in OWN_OBJECTS:
            continue
        hints = typing.get_type_hints(getattr(kube_.Kube, name))
        assert ownership.Consent in hints.values(), f"Kube.{name} writes without an ownership.Consent"


def test_consents_are_made_only_by_the_ownership_rule() -> None:
    makers = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call):
                name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
                if name == "Consent":
                    makers.append(str(path.relative_to(PACKAGE)))
    assert makers and set(makers) == {"decisions/ownership.py"}, makers
