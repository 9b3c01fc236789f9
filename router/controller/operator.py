"""Running the operator: one kopf registry, one API client, one metrics registry per run."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

import aiohttp
import kopf
from kubernetes_asyncio import client
from kubernetes_asyncio import config as k8s_config
from prometheus_client import CollectorRegistry, start_http_server

from router.controller import context as context_
from router.controller import handlers
from router.controller import kube as kube_
from router.controller import metrics as metrics_
from router.controller import settings as settings_


def connection_from(configuration: client.Configuration) -> kopf.ConnectionInfo:
    """kopf's credentials from the same Configuration our own client uses."""
    token = None
    for key in ("authorization", "BearerToken"):
        value = (configuration.api_key or {}).get(key)
        if value:
            token = value.removeprefix("Bearer ").strip()
    if not configuration.host:
        raise RuntimeError("the Kubernetes client configuration names no API server")
    return kopf.ConnectionInfo(
        server=configuration.host,
        ca_path=configuration.ssl_ca_cert,
        insecure=not configuration.verify_ssl,
        token=token,
        scheme="Bearer" if token else None,
        certificate_path=configuration.cert_file,
        private_key_path=configuration.key_file,
    )


async def load_configuration() -> client.Configuration:
    configuration = client.Configuration()
    try:
        k8s_config.load_incluster_config(client_configuration=configuration)
    except k8s_config.ConfigException:
        await k8s_config.load_kube_config(client_configuration=configuration)
    return configuration


@contextlib.asynccontextmanager
async def context(
    settings: settings_.ControllerSettings,
    *,
    configuration: client.Configuration | None = None,
    registry: CollectorRegistry | None = None,
) -> AsyncIterator[context_.Context]:
    """The shared state of one run. With an explicit ``configuration`` (tests), kopf logs in with it
    too; otherwise kopf does its own in-cluster or kubeconfig login."""
    explicit = configuration is not None
    configuration = configuration or await load_configuration()
    async with client.ApiClient(configuration) as api, aiohttp.ClientSession() as session:
        yield context_.Context(
            settings=settings,
            kube=kube_.Kube(api),
            session=session,
            metrics=metrics_.ControllerMetrics(registry or CollectorRegistry()),
            connection=connection_from(configuration) if explicit else None,
        )


async def operate(
    ctx: context_.Context, *, stop_flag: asyncio.Event | None = None, ready_flag: asyncio.Event | None = None
) -> None:
    registry = kopf.OperatorRegistry()
    handlers.register(registry, ctx)
    await kopf.operator(
        registry=registry,
        standalone=True,
        clusterwide=ctx.settings.all_namespaces,
        liveness_endpoint=(
            f"http://0.0.0.0:{ctx.settings.liveness_port}/healthz" if ctx.settings.liveness_port else None
        ),
        namespaces=list(ctx.settings.namespaces),
        stop_flag=stop_flag,
        ready_flag=ready_flag,
    )


def run(settings: settings_.ControllerSettings) -> int:
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s")
    registry = CollectorRegistry()
    if settings.metrics_port:
        start_http_server(settings.metrics_port, registry=registry)

    async def main() -> None:
        async with context(settings, registry=registry) as ctx:
            await operate(ctx)

    asyncio.run(main())
    return 0
