"""The ModelService CRD, shipped with the package: the one definition the chart copies and the
controller (and its tests) read names from."""

from __future__ import annotations

import functools
from importlib import resources
from typing import Any

FILENAME = "modelservice-crd.yaml"


def text() -> str:
    return resources.files("drain_router.controller").joinpath(FILENAME).read_text(encoding="utf-8")


@functools.cache
def load() -> dict[str, Any]:
    import yaml  # comes with the controller extra (kopf needs it); not needed for --help

    data = yaml.safe_load(text())
    assert isinstance(data, dict)
    return data


def group() -> str:
    return str(load()["spec"]["group"])


def version() -> str:
    (served,) = [v["name"] for v in load()["spec"]["versions"] if v["storage"]]
    return str(served)


def plural() -> str:
    return str(load()["spec"]["names"]["plural"])


def kind() -> str:
    return str(load()["spec"]["names"]["kind"])
