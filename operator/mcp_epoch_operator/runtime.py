"""The operator's state and I/O: the epoch service and API clients, the reachability of the
epoch service, and one worker that reconciles servers marked dirty.

Events (a pod changed, an McpServer changed, a timer) only mark a ``(namespace, server)`` key
dirty; one worker then reconciles each key at most once per wake-up. Bursts (a rollout emits
dozens of pod events) coalesce into a few reconciles, and nothing runs twice at once for the
same server. Pod lifecycle calls (bind, drain, retire) are made at once from the event itself,
because the ledger should follow the pod within milliseconds, not within a resync interval.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from mcp_epoch.contract import ACTIVE_STATES
from mcp_epoch_operator import lifecycle, resync, status
from mcp_epoch_operator.config import OperatorConfig
from mcp_epoch_operator.epochs import (
    BACKGROUND_POLICY,
    PROBE_POLICY,
    EpochServiceClient,
    EpochServiceError,
    EpochServiceUnavailable,
)
from mcp_epoch_operator.kube import KubeClient, KubeError
from mcp_epoch_operator.names import (
    SERVER_LABEL,
)
from mcp_epoch_operator.resources import build_deployment, build_service
from mcp_epoch_operator.webhook import webhook_configuration

log = logging.getLogger("mcp_epoch_operator")
#: ``kopf.event``'s signature: (object, *, type, reason, message).
PostEvent = Callable[..., None]
T = TypeVar("T")
Key = tuple[str, str]

#: Warnings about the same server are not repeated more often than this (Event spam).
WARNING_EVENT_INTERVAL = 30.0


class Runtime:
    """One per operator process; created at kopf start-up."""

    def __init__(self, config: OperatorConfig, kube: KubeClient, svc: EpochServiceClient) -> None:
        self.config = config
        self.kube = kube
        self.svc = svc
        self.reach = status.Reachability(True, config.epoch_service_url)
        self.done: dict[str, lifecycle.Stage] = {}  # pod UID -> stage the ledger has reached
        self.addressed: dict[str, str] = {}  # pod UID -> address the ledger has for it
        self.known: set[Key] = set()
        self.dirty: dict[Key, bool] = {}  # key -> also re-apply the owned objects
        self.applied: dict[Key, tuple[str, int]] = {}  # McpServer (uid, generation) applied
        self.wake = asyncio.Event()
        self.background: set[asyncio.Task[Any]] = set()
        self._warned: dict[tuple[Key, str], float] = {}
        self._targets: dict[Key, tuple[float, dict[str, Any] | None]] = {}
        self.recorded: set[Key] = set()  # keys known to be in the servers ConfigMap
        # Epochs this process has announced as retired (the watch and the resync may both
        # retire one; retiring twice is a no-op at the service, announcing twice is noise).
        self.announced: collections.OrderedDict[str, None] = collections.OrderedDict()

    # ------------------------------------------------------------------ the epoch service

    async def svc_call(self, fn: Callable[[], Awaitable[T]]) -> T:
        """Call the service, keeping ``reach`` current (it feeds every McpServer's status)."""
        try:
            result = await fn()
        except EpochServiceUnavailable as exc:
            self.set_reachable(False, str(exc))
            raise
        except EpochServiceError:
            self.set_reachable(True)
            raise
        self.set_reachable(True)
        return result

    def set_reachable(self, ok: bool, message: str = "") -> None:
        if ok == self.reach.reachable and (ok or message == self.reach.message):
            return
        if ok != self.reach.reachable:
            log.warning("epoch service %s: %s", "reachable again" if ok else "unreachable", message)
        self.reach = status.Reachability(ok, self.config.epoch_service_url, message)
        for key in self.known:  # every McpServer's condition changes
            self.dirty.setdefault(key, False)
        self.wake.set()

    # ------------------------------------------------------------------ events

    def spawn(self, coro: Awaitable[Any]) -> None:
        """Fire and forget (Events must never delay an admission answer)."""
        task = asyncio.ensure_future(coro)
        self.background.add(task)
        task.add_done_callback(self.background.discard)

    async def event_target(self, key: Key) -> dict[str, Any] | None:
        """What an Event about a server is attached to: its McpServer, else a Deployment of the
        same name (the usual convention for plain labelled Deployments)."""
        cached = self._targets.get(key)
        if cached and time.monotonic() - cached[0] < 30:
            return cached[1]
        ns, name = key
        target = await self.kube.get_mcpserver(ns, name)
        if target is None:
            target = await self.kube.get_deployment(ns, name)
        self._targets[key] = (time.monotonic(), target)
        return target

    async def event(self, key: Key, type_: str, reason: str, message: str) -> None:
        if type_ == "Warning":
            stamp = self._warned.get((key, reason))
            if stamp is not None and time.monotonic() - stamp < WARNING_EVENT_INTERVAL:
                return
            self._warned[(key, reason)] = time.monotonic()
        try:
            target = await self.event_target(key)
            if target is not None:
                await self.kube.post_event(target, type_, reason, message)
        except (KubeError, OSError) as exc:
            log.info("could not post Event %s for %s/%s: %s", reason, *key, exc)

    # ------------------------------------------------------------------ marking work

    def mark(self, namespace: str, server: str, reapply: bool = False) -> None:
        key = (namespace, server)
        self.known.add(key)
        if key not in self.recorded:
            self.recorded.add(key)
            self.spawn(self.record(key, present=True))
        self.dirty[key] = self.dirty.get(key, False) or reapply
        self.wake.set()

    # ------------------------------------------------------------------ servers ConfigMap

    async def record(self, key: Key, present: bool) -> None:
        """Remember (or forget) a server in the operator's ConfigMap.

        The ledger lists epochs per server only, so after a restart the operator must know
        which servers to resync even when nothing of a server is left in the cluster (a bare
        pod or a plain Deployment deleted while the operator was down).
        """
        item = f"{key[0]}.{key[1]}"  # both are DNS labels: no dots, so this is unambiguous
        try:
            await self.kube.patch_configmap(
                self.config.operator_namespace,
                self.config.servers_configmap,
                {"data": {item: "" if present else None}},
            )
        except KubeError as exc:
            if exc.status != 404 or not present:
                log.info("could not record server %s/%s: %s", *key, exc)
                return
            body = {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {
                    "name": self.config.servers_configmap,
                    "namespace": self.config.operator_namespace,
                    "labels": {"app.kubernetes.io/managed-by": "mcp-epoch-operator"},
                },
                "data": {item: ""},
            }
            try:
                await self.kube.create_configmap(self.config.operator_namespace, body)
            except KubeError as again:
                if again.status == 409:  # another replica created it meanwhile
                    await self.record(key, present)
                else:
                    log.info("could not record server %s/%s: %s", *key, again)

    async def recorded_servers(self) -> set[Key]:
        try:
            cm = await self.kube.get_configmap(
                self.config.operator_namespace, self.config.servers_configmap
            )
        except KubeError as exc:
            log.info("could not read the servers ConfigMap: %s", exc)
            return set()
        keys: set[Key] = set()
        for item in (cm or {}).get("data") or {}:
            ns, _, server = item.partition(".")
            if ns and server and (self.config.namespaces is None or ns in self.config.namespaces):
                keys.add((ns, server))
        return keys

    # ------------------------------------------------------------------ pod lifecycle

    async def pod_event(self, event_type: str, pod: dict[str, Any]) -> None:
        """A watch event on a labelled pod: move its epoch, then refresh the server's status."""
        meta = pod.get("metadata") or {}
        server = (meta.get("labels") or {}).get(SERVER_LABEL)
        if not server or not meta.get("namespace"):
            return
        key = (meta["namespace"], server)
        uid = meta.get("uid", "")
        ref, stage, calls = lifecycle.pod_event_calls(
            event_type, pod, self.done.get(uid), self.addressed.get(uid)
        )
        if ref is not None and stage is not None and calls and await self.run_calls(key, calls):
            self.done[uid] = max(stage, self.done.get(uid, stage))
            if ref.address:
                self.addressed[uid] = ref.address
        if event_type == "DELETED":
            self.done.pop(uid, None)
            self.addressed.pop(uid, None)
        self.mark(*key)

    async def run_calls(self, key: Key, calls: list[lifecycle.Call]) -> bool:
        """Make the calls in order; stop at the first failure (a failed bind means the epoch
        is not this pod's, so nothing after it may run). True if all succeeded."""
        for call in calls:
            try:
                await self.svc_call(
                    lambda c=call: self.svc.call(c.verb, c.epoch, c.pod_name, c.pod_uid, c.address)  # type: ignore[misc]
                )
            except EpochServiceUnavailable as exc:
                log.warning(
                    "%s %s postponed, epoch service unavailable: %s", call.verb, call.epoch, exc
                )
                return False
            except EpochServiceError as exc:
                if call.verb == "drain" and exc.code == "illegal-transition":
                    continue  # already retired: the pod went away faster than we drained
                log.warning(
                    "%s of epoch %s for pod %s failed: %s",
                    call.verb,
                    call.epoch,
                    call.pod_name,
                    exc,
                )
                self.spawn(
                    self.event(
                        key,
                        "Warning",
                        "EpochLifecycleFailed",
                        f"could not {call.verb} epoch {call.epoch} of pod {call.pod_name}: "
                        f"{exc.message} ({exc.code})",
                    )
                )
                return False
            if call.verb == "retire" and call.epoch not in self.announced:
                self.announced[call.epoch] = None
                if len(self.announced) > 10_000:
                    self.announced.popitem(last=False)
                self.spawn(
                    self.event(
                        key,
                        "Normal",
                        "EpochRetired",
                        f"retired epoch {call.epoch} of pod {call.pod_name}",
                    )
                )
        return True

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
                    await self.sync_server(key, reapply)
                except Exception:
                    log.exception("reconciling %s/%s failed", *key)
                    self.dirty.setdefault(key, reapply)  # retried after the next wake-up
            # Let a burst of events settle before the next pass.
            await asyncio.sleep(0.2)

    async def sweep(self) -> None:
        """Find every server (McpServers, labelled pods, labelled Deployments, ones seen
        before) and mark it dirty; probe the epoch service."""
        with contextlib.suppress(EpochServiceUnavailable, EpochServiceError):
            await self.svc_call(self.svc.ready)
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
        recorded = await self.recorded_servers()
        self.known |= recorded
        self.recorded |= recorded
        for key in self.known - recorded:
            self.spawn(self.record(key, present=True))
        for key in self.known:
            self.dirty[key] = True
        self.wake.set()

    async def sync_server(self, key: Key, reapply: bool) -> None:
        """Owned objects (if an McpServer), ledger vs pods, then status."""
        ns, name = key
        mcps = await self.kube.get_mcpserver(ns, name)
        problem: str | None = None
        if mcps is not None and not mcps["metadata"].get("deletionTimestamp"):
            stamp = (mcps["metadata"]["uid"], int(mcps["metadata"].get("generation") or 0))
            if reapply or self.applied.get(key) != stamp:
                problem = await self.apply_owned(key, mcps)
                if problem is None:
                    self.applied[key] = stamp

        # The ledger first, the pods second: see resync.py for why the order matters.
        ledger: list[dict[str, Any]] | None
        try:
            policy = BACKGROUND_POLICY if self.reach.reachable else PROBE_POLICY
            listing = await self.svc_call(lambda: self.svc.list_server(ns, name, policy))
            ledger = list(listing["epochs"])
        except (EpochServiceUnavailable, EpochServiceError) as exc:
            log.info("ledger of %s/%s not readable: %s", ns, name, exc)
            ledger = None
        pods = await self.kube.list_pods(ns, f"{SERVER_LABEL}={name}")
        if ledger is not None:
            plan = resync.plan_resync(ledger, pods)
            if plan.calls:
                log.info(
                    "resync %s/%s: %s",
                    ns,
                    name,
                    ", ".join(f"{c.verb} {c.epoch}" for c in plan.calls),
                )
                await self.run_calls(key, plan.calls)
                listing = await self.svc_call(lambda: self.svc.list_server(ns, name))
                ledger = list(listing["epochs"])
            if plan.pending_without_pod:
                log.debug(
                    "%s/%s: pending epochs without a pod (the service abandons them after its "
                    "pending timeout): %s",
                    ns,
                    name,
                    ", ".join(plan.pending_without_pod),
                )
        if mcps is None:
            if (
                ledger is not None
                and not pods
                and not any(e["state"] in ACTIVE_STATES for e in ledger)
            ):
                # Nothing left to watch for: forget the server until it shows up again.
                self.known.discard(key)
                self.recorded.discard(key)
                await self.record(key, present=False)
            return
        deployment = await self.kube.get_deployment(ns, name)
        new_status = status.build_status(
            mcps, deployment, ledger, pods, self.reach, problem=problem
        )
        if new_status != (mcps.get("status") or {}):
            try:
                await self.kube.patch_mcpserver_status(ns, name, new_status)
            except KubeError as exc:
                if exc.status != 404:
                    raise

    async def apply_owned(self, key: Key, mcps: dict[str, Any]) -> str | None:
        """Server-side apply the Deployment and the Service; a problem message on failure."""
        ns, name = key
        try:
            await self.kube.apply_deployment(ns, name, build_deployment(mcps, self.config.replica))
            await self.kube.apply_service(ns, name, build_service(mcps))
        except KubeError as exc:
            message = f"could not apply the Deployment/Service: {exc}"
            log.warning("%s/%s: %s", ns, name, message)
            self.spawn(self.event(key, "Warning", "ReconcileFailed", message))
            return message
        return None

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
        for task in list(self.background):
            task.cancel()
        await self.svc.aclose()
        await self.kube.aclose()
