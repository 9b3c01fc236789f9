"""The CRD shipped in the package is the single source of truth; the chart carries a copy."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from drain_router import cli
from drain_router.controller import crd
from drain_router.decisions import deletion, durations, lifecycle

CHART_COPY = Path(__file__).parents[2] / "charts" / "drain-router-controller" / "crds" / "modelservice.yaml"


def _version() -> dict:
    (version,) = crd.load()["spec"]["versions"]
    return version


def test_chart_copy_is_the_packaged_crd() -> None:
    assert CHART_COPY.read_text(encoding="utf-8") == crd.text(), (
        "charts/drain-router-controller/crds/modelservice.yaml differs: drain-router controller --print-crd > it"
    )


def test_names_and_printer_columns() -> None:
    spec = crd.load()["spec"]
    assert (spec["group"], spec["scope"], spec["names"]["shortNames"]) == ("drainrouter.dev", "Namespaced", ["msvc"])
    assert crd.version() == "v1alpha1" and crd.plural() == "modelservices"
    version = _version()
    assert version["subresources"] == {"status": {}}
    assert [c["name"] for c in version["additionalPrinterColumns"]] == ["Stage", "Outcome", "Phase", "Age"]


def test_schema_enums_and_patterns_match_the_code() -> None:
    props = _version()["schema"]["openAPIV3Schema"]["properties"]
    knobs = props["spec"]["properties"]["deletion"]["properties"]
    for field in ("maxWait", "routeSettle", "forceDeleteAfter"):
        assert knobs[field]["pattern"] == durations.PATTERN
    assert durations.parse_duration(knobs["maxWait"]["default"]) == deletion.DEFAULT_MAX_WAIT_SECS
    assert durations.parse_duration(knobs["routeSettle"]["default"]) == deletion.DEFAULT_ROUTE_SETTLE_SECS
    status = props["status"]["properties"]["deletion"]["properties"]
    assert status["stage"]["enum"] == [s.value for s in deletion.Stage]
    assert status["outcome"]["enum"] == [o.value for o in deletion.Outcome]
    assert status["pods"]["maxItems"] == status["forceDeleted"]["maxItems"] == deletion.MAX_LISTED_PODS
    written = deletion.DeletionStatus().as_dict()
    assert set(written) == set(status)


def test_idle_seconds_bounds_are_the_codes() -> None:
    """The CRD's ``idleSeconds`` and ``lifecycle.validate`` refuse the same values (issue: the CRD
    said >= 1 while the code let 0 through)."""
    rules = _version()["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["lifecycle"]["properties"]
    idle = rules["rules"]["items"]["properties"]["condition"]["properties"]["idleSeconds"]
    assert idle == {"type": "integer", "minimum": lifecycle.MIN_IDLE_SECONDS}
    for value, accepted in ((lifecycle.MIN_IDLE_SECONDS, True), (lifecycle.MIN_IDLE_SECONDS - 1, False), (1.5, False)):
        errors = lifecycle.validate([{"policy": "ScaleToZero", "condition": {"idleSeconds": value}}])
        assert (errors == ()) is accepted, (value, errors)


def test_print_crd_and_help_do_not_load_kopf() -> None:
    # In a fresh interpreter: this one may already have kopf loaded by the operator tests.
    code = (
        "import sys; from click.testing import CliRunner; from drain_router import cli; from drain_router.controller import crd\n"
        "r = CliRunner().invoke(cli.main, ['controller', '--print-crd'])\n"
        "assert r.exit_code == 0 and r.output == crd.text(), r.output\n"
        "r = CliRunner().invoke(cli.main, ['controller', '--help'])\n"
        "assert r.exit_code == 0 and '--requeue-secs' in r.output, r.output\n"
        "assert 'kopf' not in sys.modules and 'kubernetes_asyncio' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_namespace_flags_are_validated() -> None:
    result = CliRunner().invoke(cli.main, ["controller"])
    assert result.exit_code == 2 and "--all-namespaces" in result.output
    result = CliRunner().invoke(cli.main, ["controller", "--namespace", "a", "--all-namespaces"])
    assert result.exit_code == 2


def test_activation_fields_match_the_code() -> None:
    """The status the lifecycle pass writes is the CRD's ``status.lifecycle``; the phase
    enum, the printer column and ``activationTimeoutSeconds``'s default are the code's."""
    from drain_router.controller import status as status_
    from drain_router.decisions import activation

    version = _version()
    props = version["schema"]["openAPIV3Schema"]["properties"]
    record = props["status"]["properties"]["lifecycle"]["properties"]
    written = {
        **status_.lifecycle_dict(lifecycle.LifecycleStatus()),
        **status_.activation_dict(activation.ActivationStatus()),
    }
    assert set(record) == set(written)
    assert record["phase"]["enum"] == [p.value for p in activation.Phase]
    columns = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}
    assert columns["Phase"] == ".status.lifecycle.phase"
    timeout = props["spec"]["properties"]["lifecycle"]["properties"]["activationTimeoutSeconds"]
    assert (timeout["type"], timeout["minimum"]) == ("integer", 1)
    assert timeout["default"] == activation.DEFAULT_ACTIVATION_TIMEOUT_SECS
    port = props["spec"]["properties"]["router"]["properties"]["port"]
    assert (port["minimum"], port["maximum"], port["default"]) == (1, 65535, 8080)
