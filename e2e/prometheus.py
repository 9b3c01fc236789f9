"""A real Prometheus server on this machine: the model chart's PrometheusRule rendered by the real
helm and loaded as its rules file, scraping routers' admin ``/metrics`` every 200 ms and evaluating
the rules every 200 ms. Used by ``e2e/test_alerts.py``.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from drain_router_dev.process import LOOPBACK, Process, free_port, wait_until

REPO = Path(__file__).resolve().parents[1]
CHART = REPO / "charts" / "drain-router"
NAMESPACE = "models"
"""The release's namespace: the rules' default selector (namespace="models"), given to every target."""
INTERVAL = "200ms"
START_SECS = 30.0


def binary() -> str | None:
    return shutil.which("prometheus")


def render_rules(helm: Path, values: dict[str, Any], directory: Path) -> Path:
    """The model chart's PrometheusRule (enabled, plus ``values``) as a Prometheus rules file."""
    values_file = directory / "values.yaml"
    values_file.write_text(yaml.safe_dump({"monitoring": {"prometheusRule": {"enabled": True, **values}}}))
    done = subprocess.run(
        [
            *(str(helm), "template", "llama", str(CHART), "--namespace", NAMESPACE, "-f", str(values_file)),
            *("--show-only", "templates/prometheusrule.yaml"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={"HOME": str(directory), "PATH": "/usr/bin:/bin"},
    )
    if done.returncode != 0:
        raise RuntimeError(f"helm template failed: {done.stderr}")
    rule = yaml.safe_load(done.stdout)
    path = directory / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    return path


class Prometheus:
    """One ``prometheus`` process scraping ``targets`` (host:port of admin listeners) with ``rules``."""

    def __init__(self, workdir: Path, rules: Path, targets: list[str]) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.targets = len(targets)
        self.url = f"http://{LOOPBACK}:{self.port}"
        config = {
            "global": {"scrape_interval": INTERVAL, "scrape_timeout": INTERVAL, "evaluation_interval": INTERVAL},
            "rule_files": [str(rules)],
            "scrape_configs": [
                {"job_name": "routers", "static_configs": [{"targets": targets, "labels": {"namespace": NAMESPACE}}]}
            ],
        }
        config_file = workdir / "prometheus.yml"
        config_file.write_text(yaml.safe_dump(config))
        exe = binary()
        assert exe is not None
        self.process = Process(
            "prometheus",
            [
                exe,
                f"--config.file={config_file}",
                f"--storage.tsdb.path={workdir / 'data'}",
                f"--web.listen-address={LOOPBACK}:{self.port}",
                "--log.level=warn",
            ],
            workdir / "prometheus.log",
        )

    async def start(self, session: aiohttp.ClientSession) -> None:
        self.process.start()

        async def ready() -> bool:
            if not self.process.alive:
                raise self.process.failed("prometheus exited while starting")
            try:
                async with session.get(f"{self.url}/-/ready") as resp:
                    return resp.status == 200
            except aiohttp.ClientError:
                return False

        await wait_until(ready, START_SECS, "prometheus ready")

        async def scraping() -> bool:  # its discovery hands targets to the scrapers every 5 s
            targets = (await self.api(session, "targets"))["activeTargets"]
            return len(targets) == self.targets and all(t["health"] == "up" for t in targets)

        await wait_until(scraping, START_SECS, f"prometheus scraping its {self.targets} targets")

    async def api(self, session: aiohttp.ClientSession, path: str, **params: str) -> Any:
        async with session.get(f"{self.url}/api/v1/{path}", params=params) as resp:
            body = await resp.json()
        assert body["status"] == "success", body
        return body["data"]

    async def alerts(self, session: aiohttp.ClientSession, name: str) -> list[dict[str, Any]]:
        """The alerts named ``name`` Prometheus has pending or firing now (``/api/v1/alerts``)."""
        data = await self.api(session, "alerts")
        return [a for a in data["alerts"] if a["labels"]["alertname"] == name]

    async def alert_seen(self, session: aiohttp.ClientSession, name: str, since: float) -> list[dict[str, Any]]:
        """The ``ALERTS`` series of ``name`` (pending or firing) at any evaluation since Unix time ``since``."""
        window = max(1, int(time.time() - since) + 1)
        data = await self.api(session, "query", query=f'max_over_time(ALERTS{{alertname="{name}"}}[{window}s])')
        return list(data["result"])

    async def evaluated_after(self, session: aiohttp.ClientSession, moment: float, timeout: float) -> None:
        """Wait until every rule group was evaluated after Unix time ``moment`` (and the targets
        scraped after it), so the state read next reflects everything before ``moment``."""

        async def done() -> bool:
            groups = (await self.api(session, "rules"))["groups"]
            targets = (await self.api(session, "targets"))["activeTargets"]
            evaluated = all(_unix(g["lastEvaluation"]) > moment for g in groups)
            scraped = all(_unix(t["lastScrape"]) > moment for t in targets if t["health"] == "up")
            return bool(groups) and bool(targets) and evaluated and scraped

        await wait_until(done, timeout, f"prometheus to evaluate its rules after {moment:.1f}")


def _unix(stamp: str) -> float:
    """An RFC 3339 time from Prometheus's API (nanoseconds cut to microseconds) as Unix seconds."""
    import datetime

    head, _, frac = stamp.rstrip("Z").partition(".")
    frac = (frac + "000000")[:6]
    return datetime.datetime.fromisoformat(f"{head}.{frac}+00:00").timestamp()
