"""The ModelService CRD as the real API server applies it, installed by the controller chart from its
``crds/``: every rejection the CRD documents, the defaults it stores, and validation ratcheting on
an update.

The cases are the emulator's (``tests/cases/crd/admission.yaml``, which ``test_emulator.py`` holds
the emulator to) and the controller's own rules table (``tests/cases/lifecycle/validate.yaml``), so
the real answers are compared with what the emulator and cel-python believe on the same objects:
each 422 must carry exactly the causes (field, reason, message) the case file lists, and each
accepted object must be stored as the emulator's structural schema stores it.
"""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator
from typing import Any

import pytest

from drain_router.controller import crd
from drain_router.decisions import lifecycle
from e2e.kubernetes.kube import Json, Kube, path
from tests import casefiles
from tests.controller import crd_cases, schema
from tests.controller.test_crd_cel import cel_errors

NAMESPACE = "team-a"
#: Selects no pod: the controller has nothing to wait for when one of these is deleted.
LABELS = {"app": "ka-crd-no-pods"}
PREFIX = "ka-crd"
RULES_CASES = casefiles.load("lifecycle/validate.yaml")
#: A group of this scenario's own for the ratcheting CRD (a copy of the ModelService CRD).
RATCHET_GROUP = "ka-ratchet.drainrouter.dev"
pytestmark = pytest.mark.timeout(300, func_only=True)


def structural() -> schema.Structural:
    """The emulator's view of the packaged CRD's schema."""
    (version,) = crd.load()["spec"]["versions"]
    return schema.Structural(version["schema"]["openAPIV3Schema"])


async def create(kube: Kube, body: Json, collection: str | None = None) -> tuple[int, Json]:
    """POST the object: 201 and the stored object, or 422 and the Status."""
    return await kube.api.request("POST", collection or path("ModelService", NAMESPACE), body, ok=(422,))


def assert_invalid(name: str, status: int, answer: Json, expected: list[dict[str, str]], emulated: Any) -> None:
    """A 422 Invalid Status whose causes are exactly ``expected``, each also in the message."""
    assert status == 422, f"accepted, expected {expected}"
    assert (answer["kind"], answer["reason"], answer["code"]) == ("Status", "Invalid", 422), answer
    assert answer["message"].startswith(f'ModelService.{crd.group()} "{name}" is invalid: '), answer["message"]
    causes = answer["details"]["causes"]
    assert crd_cases.by_field(causes) == crd_cases.by_field(expected), f"the emulator answers {emulated}"
    for cause in causes:
        assert f"{cause['field']}: {cause['message']}" in answer["message"]


@pytest.fixture
async def stored(kube: Kube) -> AsyncIterator[list[str]]:
    """Names of the ModelServices a test stored: deleted at its end, and waited for (the
    controller's finalizer goes first)."""
    names: list[str] = []
    yield names
    for name in names:
        await kube.delete("ModelService", NAMESPACE, name)
    for name in names:
        await kube.wait_gone("ModelService", NAMESPACE, name)


@pytest.mark.parametrize("case", casefiles.params(crd_cases.CASES))
async def test_the_api_server_answers_as_the_case_file_says(
    kube: Kube, stored: list[str], case: dict[str, Any]
) -> None:
    name = f"{PREFIX}-{case['id']}"
    body = crd_cases.body(case, name, NAMESPACE, LABELS)
    emulated_obj, emulated = structural().admit(body)
    status, answer = await create(kube, body)
    if status == 201:
        stored.append(name)
    if case["causes"]:
        assert_invalid(name, status, answer, case["causes"], emulated)
        assert await kube.get("ModelService", NAMESPACE, name) is None, "nothing stored"
        return
    assert status == 201, answer
    assert not emulated, "the emulator refuses it"
    found = await kube.get("ModelService", NAMESPACE, name)
    assert found is not None
    assert found["spec"] == emulated_obj["spec"], "stored as the emulator stores it (pruned, defaulted)"


@pytest.mark.parametrize("case", casefiles.params(RULES_CASES))
async def test_lifecycle_rules_are_refused_as_the_code_refuses_them(
    kube: Kube, stored: list[str], case: dict[str, Any]
) -> None:
    """The API server refuses every rules list ``lifecycle.validate`` refuses, but the empty one
    (no minItems, nothing for CEL to check), which the controller reports as ``InvalidRules``;
    where its CEL rules ran, they broke exactly the rules cel-python says they break."""
    name = f"{PREFIX}-rules-{case['id']}"
    body = crd_cases.valid_body(name, NAMESPACE, LABELS, lifecycle={"rules": case["rules"]})
    _, emulated = structural().admit(body)
    status, answer = await create(kube, body)
    if status == 201:
        stored.append(name)
    refused_in_code = bool(lifecycle.validate(case["rules"]))
    assert (status == 422) == (refused_in_code and case["rules"] != []), answer
    if status == 422:
        assert_invalid(name, status, answer, emulated, emulated)
        causes = answer["details"]["causes"]
        if schema.UNCHECKED not in causes:
            broken = [c["message"] for c in causes if c["field"] == "spec.lifecycle.rules"]
            assert broken == [f"Invalid value: {m}" for m in cel_errors(case["rules"])]
    elif refused_in_code:

        async def reported() -> Json | None:
            found = await kube.get("ModelService", NAMESPACE, name)
            conditions = ((found or {}).get("status") or {}).get("conditions") or []
            return next((c for c in conditions if c["type"] == "LifecycleRulesValid" and c["status"] == "False"), None)

        condition = await kube.wait(f"{name}: the controller reports the rules invalid", reported)
        assert condition["reason"] == "InvalidRules", condition


async def test_defaults_are_stored_where_their_parent_is(kube: Kube, stored: list[str]) -> None:
    """Read back: each default of the CRD set under an object that is there, none under one that is
    not; unknown fields pruned. The emulator stores the same."""
    bare = crd_cases.valid_body(f"{PREFIX}-defaults-bare", NAMESPACE, LABELS)
    full = crd_cases.valid_body(
        f"{PREFIX}-defaults-full", NAMESPACE, LABELS,
        router={}, deletion={}, recycling={"unknown": 1}, lifecycle={}, unknown={"x": 1},
    )  # fmt: skip
    full["unknown"] = "top level"
    for body in (bare, full):
        status, answer = await create(kube, body)
        assert status == 201, answer
        stored.append(body["metadata"]["name"])
    found_bare = await kube.get("ModelService", NAMESPACE, bare["metadata"]["name"])
    found_full = await kube.get("ModelService", NAMESPACE, full["metadata"]["name"])
    assert found_bare is not None and found_full is not None
    selector_and_workload = {k: full["spec"][k] for k in ("podSelector", "workload")}
    assert found_bare["spec"] == {**{k: bare["spec"][k] for k in ("podSelector", "workload")}, "suspend": False}
    assert found_full["spec"] == {
        **selector_and_workload,
        "suspend": False,
        "router": {"adminPort": 9091, "port": 8080},
        "deletion": {"maxWait": "1h", "routeSettle": "60s"},
        "recycling": {"maxPodLifetimeSeconds": 86400, "waitForIdle": True},
        "lifecycle": {"activationTimeoutSeconds": 600},
    }
    assert "unknown" not in found_full
    for body, found in ((bare, found_bare), (full, found_full)):
        assert found["spec"] == structural().admit(body)[0]["spec"], "the emulator stores the same"


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: what a merge patch makes of ``target``."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    merged = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = merge_patch(merged.get(key), value)
    return merged


def ratchet_crd(*, strict: bool) -> Json:
    """The ModelService CRD in this scenario's group; not ``strict``: without the minimum of
    ``adminPort`` and without the CEL rules of ``lifecycle.rules``, so an object the real CRD
    refuses can be stored before the real CRD replaces it."""
    copied = copy.deepcopy(crd.load())  # load() is cached: never change its answer
    copied["metadata"]["name"] = f"{crd.plural()}.{RATCHET_GROUP}"
    copied["spec"]["group"] = RATCHET_GROUP
    if not strict:
        (version,) = copied["spec"]["versions"]
        spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
        del spec["router"]["properties"]["adminPort"]["minimum"]
        del spec["lifecycle"]["properties"]["rules"]["x-kubernetes-validations"]
    return copied


TWICE = [
    {"policy": "ScaleToZero", "condition": {"idleSeconds": 5}},
    {"policy": "ScaleToZero", "condition": {"idleSeconds": 9}},
]
#: (subresource, merge patch, the status the API server answers): validation ratcheting.
RATCHET_STEPS: list[tuple[str, Json, int]] = [
    # A status write to an object stored before the CRD refused its spec: the spec is unchanged.
    ("/status", {"status": {"phase": "Deleting"}}, 200),
    ("/status", {"status": {"phase": "Gone"}}, 422),
    # Another spec field changed: adminPort 0 and the rules broken by CEL still ratchet.
    ("", {"spec": {"suspend": True}}, 200),
    ("", {"spec": {"lifecycle": {"activationTimeoutSeconds": 5}}}, 200),
    # The invalid fields themselves changed: validated again.
    ("", {"spec": {"router": {"adminPort": 70000}}}, 422),
    ("", {"spec": {"lifecycle": {"rules": [*TWICE, {"policy": "DeleteSelf", "condition": {"idleSeconds": 1}}]}}}, 422),
    ("", {"spec": {"router": {"adminPort": 9091}}}, 200),
]


async def test_an_update_ratchets_unchanged_invalid_values(kube: Kube) -> None:
    """An object the CRD would now refuse (stored under a looser CRD) still takes a status write and
    changes to its other fields; a change to an invalid field is validated, OpenAPI and CEL alike.
    Each answer is also the emulator's for the same update."""
    crd_name = f"{crd.plural()}.{RATCHET_GROUP}"
    collection = f"/apis/{RATCHET_GROUP}/{crd.version()}/namespaces/{NAMESPACE}/{crd.plural()}"
    body = crd_cases.valid_body("ratchet", NAMESPACE, LABELS, router={"adminPort": 0}, lifecycle={"rules": TWICE})
    body["apiVersion"] = f"{RATCHET_GROUP}/{crd.version()}"
    await kube.apply(ratchet_crd(strict=False))
    try:

        async def established() -> bool:
            found = await kube.get("CustomResourceDefinition", None, crd_name)
            conditions = ((found or {}).get("status") or {}).get("conditions") or []
            return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)

        await kube.wait(f"{crd_name} established", established)
        status, answer = await create(kube, body, collection)
        assert status == 201, answer
        strict = ratchet_crd(strict=True)
        await kube.apply(strict)
        probe = {**body, "metadata": {**body["metadata"], "name": "probe"}}

        async def strict_in_force() -> bool:
            status, _ = await kube.api.request("POST", collection + "?dryRun=All", probe, ok=(422,))
            return status == 422

        await kube.wait("the strict CRD in force", strict_in_force)
        (version,) = strict["spec"]["versions"]
        emulator = schema.Structural(version["schema"]["openAPIV3Schema"])
        for subresource, patch, expected in RATCHET_STEPS:
            _, old = await kube.api.request("GET", f"{collection}/ratchet")
            _, emulated = emulator.admit(merge_patch(old, patch), old)
            status, answer = await kube.api.request(
                "PATCH", f"{collection}/ratchet{subresource}", patch,
                content_type="application/merge-patch+json", ok=(422,),
            )  # fmt: skip
            step = f"{subresource or 'spec'} {patch}"
            assert status == expected, f"{step}: {answer.get('message')}"
            causes = answer["details"]["causes"] if status == 422 else []
            assert crd_cases.by_field(causes) == crd_cases.by_field(emulated), f"{step}: the emulator differs"
        _, final = await kube.api.request("GET", f"{collection}/ratchet")
        assert final["spec"]["router"]["adminPort"] == 9091 and final["spec"]["suspend"] is True
        assert final["spec"]["lifecycle"] == {"rules": TWICE, "activationTimeoutSeconds": 5}
        assert final["status"] == {"phase": "Deleting"}
    finally:
        await kube.delete("CustomResourceDefinition", None, crd_name)
        await kube.wait_gone("CustomResourceDefinition", None, crd_name)
