"""The shell commands of the README and docs/*.md, as a reader sees them: extracted from fenced code
blocks, one per logical line (backslash continuations joined), and the table that says how each is
run. Pure: no process is started here (``test_commands.py`` and
``e2e/kubernetes/test_doc_commands.py`` run them).

A block is shell when its info string is ``sh``, ``bash``, ``shell`` or ``console``, or when it has
none and a line of it starts with one of :data:`COMMAND_WORDS`. In a ``console`` block only ``$ ``
lines are commands; the lines after one, up to the next ``$`` or a blank line, are its documented
output. Blank lines and lines that are only a comment are not commands.
"""

from __future__ import annotations

import dataclasses
import enum
import re
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
#: The release the docs name (their artifact file names and image tags): pyproject.toml's version.
VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
COMMAND_WORDS = ("helm", "kubectl", "drain-router", "make", "curl")
SHELL_INFO = {"sh", "bash", "shell", "console"}
FENCE = re.compile(r"^(?P<indent> *)```(?P<info>[\w-]*)[^\n]*\n(?P<body>.*?)^(?P=indent)```", re.S | re.M)
STARTS_WITH_WORD = re.compile(r"^\s*(?:\$ )?(?:sudo )?(?:" + "|".join(map(re.escape, COMMAND_WORDS)) + r")\b", re.M)


def documents() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


@dataclasses.dataclass(frozen=True)
class Command:
    file: str
    """Relative to the repository: ``README.md``, ``docs/cli.md``."""
    line: int
    """The 1-based line of the markdown file where the command starts."""
    text: str
    """As written, continuations joined by a space (``$ `` of a console block removed)."""
    output: str = ""
    """A console block's documented output for the command (the lines after it), or empty."""

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.text}"


def _is_shell(info: str, body: str) -> bool:
    return info in SHELL_INFO or (info == "" and bool(STARTS_WITH_WORD.search(body)))


def _is_comment_or_blank(line: str) -> bool:
    stripped = line.strip()
    return not stripped or stripped.startswith("#")


def commands_in_text(text: str, file: str) -> list[Command]:
    found: list[Command] = []
    for block in FENCE.finditer(text):
        info, body = block.group("info"), block.group("body")
        if not _is_shell(info, body):
            continue
        first = text.count("\n", 0, block.start("body")) + 1
        lines = [line[len(block.group("indent")) :] for line in body.splitlines()]
        found.extend(_console(lines, first, file) if info == "console" else _script(lines, first, file))
    return found


def _script(lines: list[str], first: int, file: str) -> list[Command]:
    found, i = [], 0
    while i < len(lines):
        start, parts = i, [lines[i]]
        while parts[-1].rstrip().endswith("\\") and i + 1 < len(lines):
            parts[-1] = parts[-1].rstrip()[:-1].rstrip()
            i += 1
            parts.append(lines[i].strip())
        i += 1
        text = " ".join(parts).strip()
        if not _is_comment_or_blank(text):
            found.append(Command(file, first + start, text))
    return found


def _console(lines: list[str], first: int, file: str) -> list[Command]:
    found, i = [], 0
    while i < len(lines):
        if not lines[i].startswith("$ "):
            i += 1
            continue
        start, parts = i, [lines[i][2:]]
        while parts[-1].rstrip().endswith("\\") and i + 1 < len(lines):
            parts[-1] = parts[-1].rstrip()[:-1].rstrip()
            i += 1
            parts.append(lines[i].strip())
        i += 1
        output = []
        while i < len(lines) and lines[i].strip() and not lines[i].startswith("$ "):
            output.append(lines[i])
            i += 1
        found.append(Command(file, first + start, " ".join(parts).strip(), "\n".join(output)))
    return found


def all_commands() -> list[Command]:
    found = []
    for path in documents():
        found.extend(commands_in_text(path.read_text(), str(path.relative_to(REPO))))
    return found


class How(enum.Enum):
    RUN = "run here as written (a temp dir or the repository, the venv on PATH)"
    BY_HAND = "run as written, inside the README's by-hand block, by tests/cli/test_readme.py"
    HELM = "rendered here by `helm template` with the same flags and values, and run on the cluster"
    MAKE = "its make target resolved here (`make -n`); the run itself needs what the reason says"
    CLUSTER = "run on the real control plane (e2e/kubernetes/test_doc_commands.py)"
    SKIP = "not run: needs what the reason says"


@dataclasses.dataclass(frozen=True)
class Row:
    file: str
    snippet: str
    """A stable part of the command: the row is the one command of ``file`` containing it."""
    how: How
    reason: str = ""
    """Why a command is skipped, or what a make target's real run needs."""
    cwd: str = "tmp"
    """RUN: ``tmp`` (a fresh directory) or ``repo`` (a command written with repository paths)."""
    exit_code: int = 0
    """RUN: the exit status the docs promise."""

    def matches(self, command: Command) -> bool:
        return command.file == self.file and self.snippet in command.text


INTERNET = "PyPI (the internet)"
BY_HAND = How.BY_HAND
README, CLI, CONFIGURATION, CONTROLLER = "README.md", "docs/cli.md", "docs/configuration.md", "docs/controller.md"
DEMO, IMAGE, INSTALL, KUBERNETES = "docs/demo.md", "docs/image.md", "docs/install.md", "docs/kubernetes.md"
TESTING, TRACING = "docs/testing.md", "docs/tracing.md"

#: Every command of the docs, by how it is run. A command in no row, or in two, fails the test.
TABLE: tuple[Row, ...] = (
    Row(README, "make demo", How.MAKE, "builds .venv-demo from " + INTERNET + ", then runs a minute"),
    Row(README, "make test", How.MAKE, "30 minutes, root, Go and HAProxy: it is the whole suite"),
    Row(README, "drain-router-dev fake-model --port 8000 &", BY_HAND),
    Row(README, "MODEL=$!", BY_HAND),
    Row(README, "drain-router serve --upstream http://127.0.0.1:8000 --upstream-health-path", BY_HAND),
    Row(README, "ROUTER=$!", BY_HAND),
    Row(README, "until curl -sf localhost:9091/readyz", BY_HAND),
    Row(README, "curl -sN localhost:8080/v1/completions", BY_HAND),
    Row(README, "STREAM=$!", BY_HAND),
    Row(README, "sleep 2; kill -TERM $ROUTER", BY_HAND),
    Row(README, "wait $STREAM", BY_HAND),
    Row(README, "wait $ROUTER", BY_HAND),
    Row(README, "kill $MODEL", BY_HAND),
    Row(README, "sudo make image", How.MAKE, "root, buildah and a runc container; the Debian base from its mirrors"),
    Row(README, "buildah push", How.SKIP, "a registry to push to (registry.example.com is the reader's) and buildah"),
    Row(README, "helm install drain-router-controller charts/drain-router-controller", How.HELM),
    Row(README, "helm install llama charts/drain-router", How.HELM),
    Row(CLI, "--shutdown-drain-secs 18000", How.RUN, exit_code=2),
    Row(CLI, "DRAIN_ROUTER_SHUTDOWN_DRAIN_SECS=30s", How.RUN, exit_code=2),
    Row(CLI, "--readiness-probe-period-secs 5", How.RUN, exit_code=2),
    Row(CONFIGURATION, "--shutdown-drain-secs 18000", How.RUN, exit_code=2),
    Row(CONTROLLER, "pip install 'drain-router[controller]'", How.SKIP, INTERNET),
    Row(CONTROLLER, "drain-router controller --namespace models", How.CLUSTER),
    Row(CONTROLLER, "drain-router controller --print-crd > modelservice.yaml", How.RUN),
    Row(CONTROLLER, "kubectl -n llama label httproute/llama", How.CLUSTER),
    Row(CONTROLLER, "kubectl -n llama label deployment/llama", How.CLUSTER),
    Row(DEMO, "make demo", How.MAKE, "builds .venv-demo from " + INTERNET + ", then runs a minute"),
    Row(DEMO, "pip install -c constraints.txt . ./devtools", How.SKIP, INTERNET + ": the dependencies"),
    Row(DEMO, "drain-router-dev demo", How.SKIP, "a minute of both cores; e2e/test_demo.py runs the demo"),
    Row(IMAGE, "docker build", How.SKIP, "a Docker daemon and Docker Hub (the internet) for the base"),
    Row(IMAGE, "buildah bud", How.SKIP, "root, buildah and the base image from a registry (the internet)"),
    Row(IMAGE, "scripts/build-image.sh", How.SKIP, "root, buildah and python:3.11 from Docker Hub (the internet)"),
    Row(IMAGE, "scripts/image-smoke.py", How.SKIP, "root, runc and an image built by make image"),
    Row(INSTALL, "sha256sum --ignore-missing -c SHA256SUMS", How.SKIP, "a release's files (make dist-check)"),
    Row(INSTALL, f"pip install drain_router-{VERSION}-py3-none-any.whl ", How.SKIP, INTERNET + "; make dist-check"),
    Row(INSTALL, f"pip install 'drain_router-{VERSION}-py3-none-any.whl[controller]'", How.SKIP, INTERNET),
    Row(INSTALL, f"pip install 'drain_router-{VERSION}.tar.gz[controller]'", How.SKIP, INTERNET),
    Row(INSTALL, f"pip install -c drain-router-{VERSION}-constraints.txt", How.SKIP, INTERNET + "; make dist-check"),
    Row(INSTALL, f"helm install drain-router-controller drain-router-controller-{VERSION}.tgz", How.HELM),
    Row(INSTALL, f"helm install llama drain-router-{VERSION}.tgz", How.HELM),
    Row(INSTALL, "podman load", How.SKIP, "podman and an image archive from make dist DIST_IMAGE=1 (root)"),
    Row(INSTALL, "skopeo copy", How.SKIP, "a registry to push to (registry.example.com is the reader's)"),
    Row(KUBERNETES, "helm install drain-router-controller charts/drain-router-controller", How.HELM),
    Row(KUBERNETES, "helm install llama charts/drain-router", How.HELM),
    Row(KUBERNETES, "helm upgrade --install drain-router-controller", How.HELM),
    Row(TESTING, "make mutate  ", How.MAKE, "about 15 minutes of both cores"),
    Row(TESTING, 'make mutate MUTANTS="deletion-phase-not-written"', How.MAKE, "a minute of both cores"),
    Row(TESTING, "scripts/mutate.py --check", How.RUN, cwd="repo"),
    Row(TRACING, "pip install 'drain-router[otel]'", How.SKIP, INTERNET),
    Row(TRACING, "drain-router serve --upstream http://127.0.0.1:8000 --tracing", How.RUN),
)


def rows_for(command: Command) -> list[Row]:
    return [row for row in TABLE if row.matches(command)]
