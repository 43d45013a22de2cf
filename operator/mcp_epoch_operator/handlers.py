"""kopf registrations: thin, every decision lives in the pure modules and in ``Runtime``.

A fresh ``kopf.OperatorRegistry`` per run (not kopf's global one), so the handlers close over
the configuration they were built with and importing this module registers nothing.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from collections.abc import AsyncIterator
from typing import Any, cast

import kopf

from mcp_epoch import api
from mcp_epoch.api_client import EpochServiceError, EpochServiceUnavailable
from mcp_epoch_operator import kube as kube_mod
from mcp_epoch_operator import reconcile
from mcp_epoch_operator.config import OperatorConfig
from mcp_epoch_operator.epochs import WEBHOOK_POLICY, connect
from mcp_epoch_operator.metrics import Admission
from mcp_epoch_operator.names import (
    GROUP,
    MANAGED_BY_LABEL,
    MANAGED_BY_VALUE,
    PLURAL,
    SERVER_LABEL,
    VERSION,
    WEBHOOK_ID,
)
from mcp_epoch_operator.runtime import Runtime
from mcp_epoch_operator.webhook import Refusal, inject, refusal_message, target_of

log = logging.getLogger("mcp_epoch_operator")

#: The admission request being served. kopf hands handlers the object but not the request's
#: UID and namespace, which the epoch is keyed by; the server below records them here.
CURRENT_REQUEST: contextvars.ContextVar[dict[str, Any]] = contextvars.ContextVar("admission")


def recorded_request() -> dict[str, Any]:
    """The admission request being served. Without one the webhook cannot key an epoch, and a
    labelled pod must never be admitted without its epoch: refuse (fail closed)."""
    request = CURRENT_REQUEST.get(None)
    if request is None:
        log.error("admission request not recorded: refusing a labelled pod (an operator bug)")
        raise kopf.AdmissionError(
            "mcp-epoch: the operator did not record this admission request, so it cannot issue "
            "the pod's epoch; the pod is refused rather than run without one (an operator bug: "
            "report it, and retry the create)",
            code=500,
        )
    return request


class EpochWebhookServer(kopf.WebhookServer):
    """kopf's HTTPS webhook server with our certificates, recording each admission request.

    The context variable is set in the request's own task before kopf runs the handler, so
    the handler (same task, or a task copied from its context) sees exactly its request.
    """

    async def __call__(self, fn: Any) -> AsyncIterator[Any]:
        async def recording(request: dict[str, Any], **kwargs: Any) -> Any:
            token = CURRENT_REQUEST.set(request.get("request") or {})
            try:
                return await fn(request, **kwargs)
            finally:
                CURRENT_REQUEST.reset(token)

        async for client_config in super().__call__(cast(Any, recording)):
            yield client_config


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
        settings.admission.managed = None  # the chart (or register_webhook) owns the config
        if config.webhook is not None:
            serving = config.webhook
            settings.admission.server = EpochWebhookServer(
                addr=serving.listen,
                port=serving.port,
                host=serving.advertise or serving.listen,
                certfile=serving.cert,
                pkeyfile=serving.key,
                cafile=serving.ca,
            )
        kube = kube_mod.KubeClient(lambda: kube_mod.login(settings))
        verify: Any = str(config.epoch_service_ca) if config.epoch_service_ca else True
        svc = connect(config.epoch_service_url, config.operator_token, verify)
        rt = Runtime(config, kube, svc)
        state["runtime"] = rt
        if config.metrics_port is not None:
            rt.metrics.serve(config.metrics_port)
        if config.register_webhook:
            await rt.register_webhook()
        state["worker"] = asyncio.create_task(rt.run(), name="mcp-epoch-worker")

    @kopf.on.cleanup(registry=registry)
    async def cleanup(**_: Any) -> None:
        worker = state.pop("worker", None)
        if worker is not None:
            worker.cancel()
            await asyncio.gather(worker, return_exceptions=True)
        rt = state.pop("runtime", None)
        if rt is not None:
            await rt.aclose()

    @kopf.on.mutate(
        "v1",
        "pods",
        id=WEBHOOK_ID,
        operations=["CREATE"],
        side_effects=True,
        labels={SERVER_LABEL: kopf.PRESENT},
        registry=registry,
    )
    async def inject_epoch(patch: kopf.Patch, dryrun: bool, warnings: list[str], **_: Any) -> None:
        began = time.perf_counter()
        rt = runtime()
        outcome: Admission = "refused"
        try:
            outcome = await admit(rt, patch, dryrun, warnings)
        finally:
            rt.metrics.admission(outcome, began)

    async def admit(rt: Runtime, patch: kopf.Patch, dryrun: bool, warnings: list[str]) -> Admission:
        """The webhook's work: what happened to this pod (an AdmissionError refuses it)."""
        request = recorded_request()
        try:
            target = target_of(request)
        except Refusal as exc:
            raise kopf.AdmissionError(f"mcp-epoch: {exc}", code=400) from None
        if target is None:
            return "skipped"
        if dryrun:
            # sideEffects NoneOnDryRun: a dry run must not issue an epoch.
            warnings.append("mcp-epoch: dry run, so no epoch was issued for this pod")
            return "skipped"
        key = (target.namespace, target.server)
        try:
            issued = await rt.svc_call(
                api.issue(target.namespace, target.server, target.request_uid), WEBHOOK_POLICY
            )
        except EpochServiceUnavailable as exc:
            message = refusal_message(target, config.epoch_service_url, str(exc))
            rt.mark(*key)
            rt.events.post(key, "Warning", "EpochServiceUnreachable", message)
            raise kopf.AdmissionError(message, code=503) from None
        except EpochServiceError as exc:
            message = (
                f"mcp-epoch: the epoch service refused to issue an epoch for "
                f"{target.namespace}/{target.server}: {exc.message} ({exc.code})"
            )
            rt.events.post(key, "Warning", "EpochIssueFailed", message)
            raise kopf.AdmissionError(
                message, code=exc.status if exc.status < 500 else 503
            ) from None
        epoch = issued.epoch
        patch.fns.append(
            lambda body: inject(cast(dict[str, Any], body), epoch, target.server, config.replica)
        )
        rt.mark(*key)
        rt.events.post(
            key,
            "Normal",
            "EpochIssued",
            f"issued pod epoch {epoch} (generation {issued.generation}) for a new pod "
            f"of {target.namespace}/{target.server}",
        )
        return "issued"

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
