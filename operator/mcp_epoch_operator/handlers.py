"""kopf registrations: thin, every decision lives in the pure modules and in ``Runtime``.

A fresh ``kopf.OperatorRegistry`` per run (not kopf's global one), so the handlers close over
the configuration they were built with and importing this module registers nothing.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import kopf

from mcp_epoch_operator import kube as kube_mod
from mcp_epoch_operator import reconcile
from mcp_epoch_operator.admission import AdmissionServer, LoopSink
from mcp_epoch_operator.config import OperatorConfig
from mcp_epoch_operator.epochs import client_for
from mcp_epoch_operator.names import (
    GROUP,
    MANAGED_BY_LABEL,
    MANAGED_BY_VALUE,
    PLURAL,
    SERVER_LABEL,
    VERSION,
)
from mcp_epoch_operator.runtime import Runtime

log = logging.getLogger("mcp_epoch_operator")


#: The watches, filtered by the API server. kopf's ``labels=`` on the handlers filter in the
#: operator, after every pod of the cluster has been sent and parsed (bench webhook: 2.3 s of
#: CPU per 1,000 pods the operator has nothing to do with, and 0.1 s with these).
WATCH_SELECTORS: dict[tuple[str, str] | tuple[str, str, str], str] = {
    ("v1", "pods"): SERVER_LABEL,
    ("apps", "v1", "deployments"): f"{MANAGED_BY_LABEL}={MANAGED_BY_VALUE},{SERVER_LABEL}",
}


def build_registry(config: OperatorConfig) -> kopf.OperatorRegistry:
    """Every handler of the operator, bound to ``config``."""
    registry = kopf.OperatorRegistry()
    state: dict[str, Any] = {}

    def runtime() -> Runtime:
        rt: Runtime = state["runtime"]
        return rt

    @kopf.on.login(registry=registry)
    def login(settings: kopf.OperatorSettings, **_: Any) -> Any:
        # The same discovery the operator's own client uses (kube.login).
        return kube_mod.login(settings)

    @kopf.on.startup(registry=registry)
    async def startup(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.posting.level = logging.WARNING
        settings.watching.server_timeout = 300
        settings.watching.reconnect_backoff = 1.0
        for resource, selector in WATCH_SELECTORS.items():
            settings.watching.label_selectors[resource] = selector
        kube = kube_mod.KubeClient(lambda: kube_mod.login(settings))
        rt = Runtime(config, kube, client_for(config))
        state["runtime"] = rt
        if config.metrics_port is not None:
            rt.metrics.serve(config.metrics_port)
        if config.webhook is not None:
            # Not kopf's webhook server: admissions must not queue behind kopf's loop.
            server = AdmissionServer(
                config.webhook,
                config,
                rt.metrics,
                LoopSink(rt, asyncio.get_running_loop()),
                lambda: kube_mod.login(settings),
            )
            await asyncio.to_thread(server.start)
            state["admission"] = server
            rt.metrics.follow_retries(lambda: server.retries)
        if config.register_webhook:
            await rt.register_webhook()
        state["worker"] = asyncio.create_task(rt.run(), name="mcp-epoch-worker")

    @kopf.on.cleanup(registry=registry)
    async def cleanup(**_: Any) -> None:
        server = state.pop("admission", None)
        if server is not None:  # first: admissions in flight still hand work to the runtime
            await asyncio.to_thread(server.stop)
        worker = state.pop("worker", None)
        if worker is not None:
            worker.cancel()
            await asyncio.gather(worker, return_exceptions=True)
        rt = state.pop("runtime", None)
        if rt is not None:
            await rt.aclose()

    @kopf.on.event("v1", "pods", labels={SERVER_LABEL: kopf.PRESENT}, registry=registry)
    async def pod_changed(type: str | None, body: kopf.Body, **_: Any) -> None:
        await reconcile.pod_event(runtime(), type or "ADDED", dict(body))

    @kopf.on.event(GROUP, VERSION, PLURAL, registry=registry)
    async def server_changed(type: str, name: str, namespace: str | None, **_: Any) -> None:
        if type != "DELETED" and namespace:
            runtime().mark(namespace, name, reapply=False)

    @kopf.on.event(
        "apps/v1",
        "deployments",
        labels={MANAGED_BY_LABEL: MANAGED_BY_VALUE, SERVER_LABEL: kopf.PRESENT},
        registry=registry,
    )
    async def deployment_changed(type: str | None, body: kopf.Body, **_: Any) -> None:
        meta = body.get("metadata") or {}
        # A changed or deleted owned Deployment is put back (drift) and its status shown.
        runtime().mark(meta["namespace"], meta["labels"][SERVER_LABEL], reapply=True)

    return registry


def run(config: OperatorConfig, *, verbose: bool = False) -> int:
    """Run the operator until SIGTERM/SIGINT."""
    kopf.configure(verbose=verbose, log_prefix=False)
    # One line per HTTP request drowns the operator's own messages.
    quiet = logging.DEBUG if verbose else logging.WARNING
    for name in ("httpx", "aiohttp.access", "kopf.objects"):
        logging.getLogger(name).setLevel(quiet)
    registry = build_registry(config)
    kopf.run(
        registry=registry,
        standalone=True,  # every replica acts (all calls are idempotent); no peering objects
        clusterwide=config.namespaces is None,
        namespaces=config.namespaces or (),
        liveness_endpoint=config.health_endpoint,
    )
    return 0
