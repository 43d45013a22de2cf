"""Kubernetes Events about a server: where they attach, and how often they may repeat.

An Event about a server attaches to its McpServer, else to a Deployment of the same name (the
convention for plain labelled Deployments). Posting never delays the caller (an admission
answer above all): :meth:`EventPoster.post` queues it as a background task. A Warning with
the same reason is not repeated for a server within :data:`WARNING_EVENT_INTERVAL`, and an
epoch's retirement is announced once even if the watch and the resync both retire it. The
epochs issued at admissions are announced together, one Event per server per
:data:`ISSUED_EVENT_INTERVAL`: an Event per pod cost the admissions of a rollout their tail
(the posts competed with the webhook's thread; ``python -m bench webhook``).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Awaitable
from typing import Any

from mcp_epoch_operator.kube import KubeClient, KubeError

log = logging.getLogger("mcp_epoch_operator")
Key = tuple[str, str]

#: Warnings about the same server are not repeated more often than this (Event spam).
WARNING_EVENT_INTERVAL = 30.0
#: How long an Event's target (the McpServer or Deployment) is remembered.
TARGET_CACHE_SECONDS = 30.0
_ANNOUNCED_MAX = 10_000
#: Epochs issued to a server's new pods within this long are announced in one Event.
ISSUED_EVENT_INTERVAL = 2.0
#: At most this many of them are named in it.
ISSUED_NAMED = 10


class EventPoster:
    def __init__(self, kube: KubeClient) -> None:
        self.kube = kube
        self.background: set[asyncio.Task[Any]] = set()
        self._warned: dict[tuple[Key, str], float] = {}
        self._targets: dict[Key, tuple[float, dict[str, Any] | None]] = {}
        self._announced: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._issued: dict[Key, list[tuple[str, int]]] = {}

    def spawn(self, coro: Awaitable[Any]) -> None:
        """Fire and forget."""
        task = asyncio.ensure_future(coro)
        self.background.add(task)
        task.add_done_callback(self.background.discard)

    def post(self, key: Key, type_: str, reason: str, message: str) -> None:
        self.spawn(self.event(key, type_, reason, message))

    def retired(self, key: Key, epoch: str, pod_name: str | None) -> None:
        """Announce a retired epoch, once per epoch."""
        if epoch in self._announced:
            return
        self._announced[epoch] = None
        if len(self._announced) > _ANNOUNCED_MAX:
            self._announced.popitem(last=False)
        self.post(key, "Normal", "EpochRetired", f"retired epoch {epoch} of pod {pod_name}")

    def issued(self, key: Key, epoch: str, generation: int) -> None:
        """Announce an epoch an admission gave a new pod, with the others of the same moment."""
        pending = self._issued.setdefault(key, [])
        if not pending:
            asyncio.get_running_loop().call_later(ISSUED_EVENT_INTERVAL, self._announce, key)
        pending.append((epoch, generation))

    def _announce(self, key: Key) -> None:
        issued = sorted(self._issued.pop(key, []), key=lambda e: e[1])
        if not issued:
            return
        named = ", ".join(f"{epoch} (generation {g})" for epoch, g in issued[:ISSUED_NAMED])
        more = f" and {len(issued) - ISSUED_NAMED} more" if len(issued) > ISSUED_NAMED else ""
        pods = "a new pod" if len(issued) == 1 else f"{len(issued)} new pods"
        self.post(
            key,
            "Normal",
            "EpochIssued",
            f"issued pod epoch {named}{more} for {pods} of {key[0]}/{key[1]}",
        )

    async def target(self, key: Key) -> dict[str, Any] | None:
        cached = self._targets.get(key)
        if cached and time.monotonic() - cached[0] < TARGET_CACHE_SECONDS:
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
            target = await self.target(key)
            if target is not None:
                await self.kube.post_event(target, type_, reason, message)
        except (KubeError, OSError) as exc:
            log.info("could not post Event %s for %s/%s: %s", reason, *key, exc)

    def aclose(self) -> None:
        for task in list(self.background):
            task.cancel()
