"""What the node agent runs for an image (devtools/drain_router_dev/kube/images.py)."""

from __future__ import annotations

import pytest

from drain_router_dev.kube import images


@pytest.mark.parametrize(
    ("image", "name"),
    [
        ("drain-router:0.1.0", "drain-router"),
        ("registry.example.com/team/drain-router:0.1.0", "drain-router"),
        ("registry.example.com:5000/drain-router@sha256:abc", "drain-router"),
        ("llama-cpp-server", "llama-cpp-server"),
    ],
)
def test_repository_ignores_registry_tag_and_digest(image: str, name: str) -> None:
    assert images.repository(image) == name


def test_args_follow_the_entrypoint_and_a_command_replaces_it() -> None:
    assert images.argv("drain-router:1", [], ["serve", "--port", "1"]) == [
        *images.ENTRYPOINTS["drain-router"],
        "serve",
        "--port",
        "1",
    ]
    replaced = images.argv("drain-router:1", ["drain-router-dev"], ["fake-model"])
    assert replaced[0].endswith("/drain-router-dev") and replaced[1:] == ["fake-model"]


@pytest.mark.parametrize(
    ("image", "command"),
    [("vllm/vllm-openai:v0.18.0", []), ("busybox", []), ("busybox", ["no-such-program-here"])],
    ids=["unknown-image", "no-entrypoint-no-command", "command-not-on-this-node"],
)
def test_what_cannot_run_here_is_refused(image: str, command: list[str]) -> None:
    with pytest.raises(images.UnknownImage):
        images.argv(image, command, [])
