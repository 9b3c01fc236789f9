"""The ``helm`` fixture: a real, pinned helm binary (see :mod:`tests.chart.helm`)."""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.chart.helm import Helm, obtain_helm


@pytest.fixture(scope="session")
def helm(tmp_path_factory: pytest.TempPathFactory) -> Helm:
    try:
        binary = obtain_helm()
        version = subprocess.run([str(binary), "version", "--short"], capture_output=True, text=True, timeout=10)
        if version.returncode != 0:
            raise RuntimeError(f"{binary} version failed: {version.stderr.strip()}")
    except (OSError, RuntimeError, subprocess.TimeoutExpired) as exc:
        if os.environ.get("CHART_TEST_REQUIRE_HELM") == "1":
            pytest.fail(f"helm is required (CHART_TEST_REQUIRE_HELM=1) but could not be obtained: {exc}")
        pytest.skip(f"helm could not be obtained (chart tests need a real helm binary): {exc}")
    return Helm(binary=binary, home=tmp_path_factory.mktemp("helm-home"))
