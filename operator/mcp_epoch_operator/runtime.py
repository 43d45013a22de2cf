"""The operator's state and its one worker.

Events (a pod changed, an McpServer changed, a timer) only mark a ``(namespace, server)`` key
dirty; one worker then reconciles each key at most once per wake-up
(:func:`~mcp_epoch_operator.reconcile.sync_server`). Bursts (a rollout emits dozens of pod
events) coalesce into a few reconciles, and nothing runs twice at once for the same server.
Pod lifecycle calls (bind, drain, retire) are made at once from the event itself
(:func:`~mcp_epoch_operator.reconcile.pod_event`), because the ledger should follow the pod
within milliseconds, not within a resync interval. Every resync interval a sweep finds every
server (labelled pods, McpServers, the servers recorded in the ConfigMap) and marks it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import TypeVar

from pydantic import BaseModel

from mcp_epoch.api import Call, ready
from mcp_epoch.api_client import (
    EpochServiceClient,
    EpochServiceError,
    EpochServiceUnavailable,
    RetryPolicy,
)
from mcp_epoch_operator import lifecycle, reconcile, status
from mcp_epoch_operator.config import OperatorConfig
from mcp_epoch_operator.epochs import READY_POLICY, send_counted
from mcp_epoch_operator.events import EventPoster
from mcp_epoch_operator.kube import KubeClient
from mcp_epoch_operator.metrics import OperatorMetrics
from mcp_epoch_operator.names import SERVER_LABEL
from mcp_epoch_operator.servers import ServersRecord
from mcp_epoch_operator.webhook import webhook_configuration

log = logging.getLogger("mcp_epoch_operator")
M = TypeVar("M", bound=BaseModel)
Key = tuple[str, str]


class Runtime:
    """One per operator process; created at kopf start-up."""

    def __init__(self, config: OperatorConfig, kube: KubeClient, svc: EpochServiceClient) -> None:
        self.config = config
        self.kube = kube
        self.svc = svc
        self.events = EventPoster(kube)
        self.servers = ServersRecord(kube, config)
        self.reach = status.Reachability(True, config.epoch_service_url)
        self.done: dict[str, lifecycle.Stage] = {}  # pod UID -> stage the ledger has reached
        self.addressed: dict[str, str] = {}  # pod UID -> address the ledger has for it
        self.known: set[Key] = set()
        self.dirty: dict[Key, bool] = {}  # key -> also re-apply the owned objects
        self.applied: dict[Key, tuple[str, int]] = {}  # McpServer (uid, generation) applied
        self.wake = asyncio.Event()
        self.recorded: set[Key] = set()  # keys known to be in the servers ConfigMap
        self.stalls: dict[Key, int | None] = {}  # ring revision whose stall was announced
        self.ring_phases: dict[Key, str] = {}  # the ring phase last seen, per server
        self.metrics = OperatorMetrics()
        self.metrics.follow_retries(lambda: self.svc.retries)

    # ------------------------------------------------------------------ the epoch service

    async def svc_call(self, call: Call[M], policy: RetryPolicy | None = None) -> M:
        """Call the service, keeping ``reach`` current (it feeds every McpServer's status)."""
        return await send_counted(self.svc, call, policy, self.metrics, self.set_reachable)

    def set_reachable(self, ok: bool, message: str = "") -> None:
        if ok == self.reach.reachable and (ok or message == self.reach.message):
            return
        if ok != self.reach.reachable:
            log.warning("epoch service %s: %s", "reachable again" if ok else "unreachable", message)
        self.reach = status.Reachability(ok, self.config.epoch_service_url, message)
        for key in self.known:  # every McpServer's condition changes
            self.dirty.setdefault(key, False)
        self.wake.set()

    # ------------------------------------------------------------------ marking work

    def mark(self, namespace: str, server: str, reapply: bool = False) -> None:
        key = (namespace, server)
        self.known.add(key)
        if key not in self.recorded:
            self.recorded.add(key)
            self.events.spawn(self.servers.record(key, present=True))
        self.dirty[key] = self.dirty.get(key, False) or reapply
        self.wake.set()

    def mark_later(self, key: Key, delay: float) -> None:
        """Reconcile the server again after ``delay`` seconds (a rotation under way)."""
        asyncio.get_running_loop().call_later(delay, self.mark, *key)

    def forget(self, key: Key) -> None:
        """Nothing is left of the server: no more reconciles until it shows up again."""
        self.known.discard(key)
        self.recorded.discard(key)
        self.stalls.pop(key, None)
        self.ring_phases.pop(key, None)  # a server made anew under the name starts unseen
        self.metrics.forget_server(key)

    # ------------------------------------------------------------------ the worker

    async def run(self) -> None:
        """Reconcile dirty servers; every resync interval, sweep everything."""
        next_sweep = 0.0
        while True:
            now = time.monotonic()
            if now >= next_sweep:
                next_sweep = now + self.config.resync_interval
                try:
                    await self.sweep()
                except Exception:  # a failed sweep is retried at the next interval
                    log.exception("resync sweep failed")
            if not self.dirty:
                self.wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(
                        self.wake.wait(), max(0.05, next_sweep - time.monotonic())
                    )
                continue
            batch, self.dirty = self.dirty, {}
            for key, reapply in sorted(batch.items()):
                try:
                    with self.metrics.reconciling():
                        await reconcile.sync_server(self, key, reapply)
                except Exception:
                    log.exception("reconciling %s/%s failed", *key)
                    self.dirty.setdefault(key, reapply)  # retried after the next wake-up
            # Let a burst of events settle before the next pass.
            await asyncio.sleep(0.2)

    async def sweep(self) -> None:
        """Find every server (McpServers, labelled pods, labelled Deployments, ones seen
        before) and mark it dirty; probe the epoch service."""
        with contextlib.suppress(EpochServiceUnavailable, EpochServiceError):
            await self.svc_call(ready(), READY_POLICY)
        namespaces: list[str | None] = (
            list(self.config.namespaces) if self.config.namespaces else [None]
        )
        for ns in namespaces:
            # Labelled objects only: the API server filters, the operator never lists the
            # cluster's other pods. A plain Deployment is found through its labelled pods;
            # one scaled to zero has nothing to reconcile beyond what the ConfigMap recorded.
            for pod in await self.kube.list_pods(ns, SERVER_LABEL):
                meta = pod["metadata"]
                self.known.add((meta["namespace"], meta["labels"][SERVER_LABEL]))
            for mcps in await self.kube.list_mcpservers(ns):
                self.known.add((mcps["metadata"]["namespace"], mcps["metadata"]["name"]))
        recorded = await self.servers.recorded()
        self.known |= recorded
        self.recorded |= recorded
        for key in self.known - recorded:
            self.events.spawn(self.servers.record(key, present=True))
        for key in self.known:
            self.dirty[key] = True
        self.wake.set()

    # ------------------------------------------------------------------ webhook registration

    async def register_webhook(self) -> None:
        """Local mode only: create or update the MutatingWebhookConfiguration pointing at this
        process. In a cluster the chart owns it and the operator never touches it."""
        serving = self.config.webhook
        assert serving is not None
        ca_path = serving.ca or serving.cert
        host = serving.advertise or serving.listen
        config = webhook_configuration(
            self.config.webhook_config_name,
            url=f"https://{host}:{serving.port}",
            ca_bundle=ca_path.read_bytes(),
            excluded_namespaces=self.config.webhook_excluded_namespaces(),
            included_namespaces=self.config.namespaces,
            timeout_seconds=self.config.webhook_timeout_seconds,
        )
        await self.kube.apply_webhook_configuration(self.config.webhook_config_name, config)
        log.info("registered MutatingWebhookConfiguration %s", self.config.webhook_config_name)

    async def aclose(self) -> None:
        self.events.aclose()
        await self.svc.aclose()
        await self.kube.aclose()
