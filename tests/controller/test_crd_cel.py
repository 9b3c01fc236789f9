"""The CRD's CEL rules for ``spec.lifecycle.rules``, evaluated with cel-python, agree with
``lifecycle.validate`` on every case of ``tests/cases/lifecycle/validate.yaml`` the OpenAPI schema
lets through (known policy, integer ``idleSeconds`` >= 1, at most three rules). The API server
refuses with the CEL rules what the controller would otherwise report as ``InvalidRules``."""

from __future__ import annotations

from typing import Any

import celpy
import pytest

from drain_router.controller import crd
from drain_router.decisions import lifecycle
from tests import casefiles

CASES = casefiles.load("lifecycle/validate.yaml")
POLICIES = {p.value for p in lifecycle.Policy}


def _rules_schema() -> dict[str, Any]:
    (version,) = crd.load()["spec"]["versions"]
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    return dict(spec["lifecycle"]["properties"]["rules"])


def _schema_accepts(rules: list[dict[str, Any]]) -> bool:
    schema = _rules_schema()
    if len(rules) > schema["maxItems"]:
        return False
    minimum = schema["items"]["properties"]["condition"]["properties"]["idleSeconds"]["minimum"]
    for rule in rules:
        idle = (rule.get("condition") or {}).get("idleSeconds")
        if rule.get("policy") not in POLICIES or isinstance(idle, bool) or not isinstance(idle, int) or idle < minimum:
            return False
    return True


def cel_errors(rules: list[dict[str, Any]]) -> list[str]:
    """The messages of the CRD's CEL rules that ``rules`` break."""
    env = celpy.Environment()
    broken = []
    for check in _rules_schema()["x-kubernetes-validations"]:
        program = env.program(env.compile(check["rule"]))
        if not program.evaluate({"self": celpy.json_to_cel(rules)}):
            broken.append(check["message"])
    return broken


def test_the_crd_has_both_rules() -> None:
    assert [c["message"] for c in _rules_schema()["x-kubernetes-validations"]] == [
        "one rule per policy",
        "idle thresholds must be strictly ordered ScaleToZero < DeleteWorkload < DeleteSelf",
    ]


@pytest.mark.parametrize(
    "case", [pytest.param(c, id=c["id"]) for c in CASES if c["rules"] and _schema_accepts(c["rules"])]
)
def test_cel_agrees_with_validate(case: dict[str, Any]) -> None:
    assert bool(cel_errors(case["rules"])) == bool(lifecycle.validate(case["rules"])), case["id"]


def test_the_cases_cover_both_verdicts() -> None:
    checked = [c for c in CASES if c["rules"] and _schema_accepts(c["rules"])]
    assert any(not c["errors"] for c in checked) and sum(1 for c in checked if c["errors"]) >= 3


@pytest.mark.parametrize(
    ("rules", "message"),
    [
        (
            [
                {"policy": "ScaleToZero", "condition": {"idleSeconds": 5}},
                {"policy": "ScaleToZero", "condition": {"idleSeconds": 6}},
            ],
            "one rule per policy",
        ),
        (
            [
                {"policy": "DeleteWorkload", "condition": {"idleSeconds": 9}},
                {"policy": "DeleteSelf", "condition": {"idleSeconds": 9}},
            ],
            "idle thresholds must be strictly ordered",
        ),
        (
            [
                {"policy": "DeleteSelf", "condition": {"idleSeconds": 10}},
                {"policy": "ScaleToZero", "condition": {"idleSeconds": 20}},
            ],
            "idle thresholds must be strictly ordered",
        ),
    ],
)
def test_each_rule_names_its_problem(rules: list[dict[str, Any]], message: str) -> None:
    (broken,) = cel_errors(rules)
    assert broken.startswith(message)


def test_the_empty_list_is_refused_in_code_only() -> None:
    """No minItems in the schema and nothing for CEL to check: the controller's validation reports it."""
    assert cel_errors([]) == [] and lifecycle.validate([])
