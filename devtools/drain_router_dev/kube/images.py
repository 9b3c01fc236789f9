"""What an image runs on this machine: the node agent has no container runtime, so each image name
maps to the program its entrypoint would start here. A container's ``command`` replaces the
entrypoint and its ``args`` follow, as in a real runtime; a ``command`` whose first word is not a path
is looked up in the agent's PATH (the virtual environment's ``bin`` first).

The tag is ignored: every tag of an image runs the code installed here.

==========================  ====================================================================
image (repository)          runs
==========================  ====================================================================
``drain-router``            ``drain-router`` (this repository's image: the router, the controller,
                            the activator, the front)
``drain-router-dev``        ``drain-router-dev`` (the fake model server: ``fake-model ...``)
``llama-cpp-server``        ``python -m llama_cpp.server`` (the real engine, ``make engine``)
``busybox``                 no entrypoint (the command names a program on this machine)
==========================  ====================================================================
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

BIN = Path(sys.executable).parent

ENTRYPOINTS: dict[str, list[str]] = {
    "drain-router": [str(BIN / "drain-router")],
    "drain-router-dev": [str(BIN / "drain-router-dev")],
    "llama-cpp-server": [sys.executable, "-m", "llama_cpp.server"],
    "busybox": [],
}


class UnknownImage(ValueError):
    """No entry for the image: the pod's container cannot start (``ErrImagePull`` in its status)."""


def repository(image: str) -> str:
    """``registry.example.com/team/name:tag@sha256:...`` -> ``name``."""
    name = image.split("@", 1)[0]
    last = name.rsplit("/", 1)[-1]
    return last.split(":", 1)[0]


def argv(image: str, command: list[str], args: list[str]) -> list[str]:
    """The program and arguments a container of ``image`` with ``command`` and ``args`` runs."""
    entry = ENTRYPOINTS.get(repository(image))
    if entry is None:
        raise UnknownImage(f"no program on this node for image {image!r} (known: {', '.join(sorted(ENTRYPOINTS))})")
    words = list(command) + list(args) if command else entry + list(args)
    if not words:
        raise UnknownImage(f"image {image!r} has no entrypoint and the container names no command")
    if "/" not in words[0]:
        found = shutil.which(words[0], path=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
        if found is None:
            raise UnknownImage(f"{words[0]!r} is not a program on this node")
        words[0] = found
    return words
