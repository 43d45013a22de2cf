"""The admission lease: which operator process hands out pod epochs.

Admissions take their epochs from a pool issued ahead (:mod:`.pool`), so no admission waits
for a durable write. A pool is only safe in one place at a time: a pod created later must get
a later generation than every pod whose admission completed before it began, and two
processes each holding a pool would interleave them (X holds 10 and 11, Y holds 12 and 13; a
pod admitted on Y gets 12, the next one on X gets 10). So one process hands out, the holder
of a ``coordination.k8s.io`` Lease, and the others forward their admissions to it
(:mod:`.admission`).

The rules are client-go's leader election, kept by this process's monotonic clock:

* the holder hands out only until ``its renewal's start + duration - margin``;
* another process takes the Lease only once it has seen the record unchanged for a whole
  ``duration`` of its own clock (or empty: a holder that stopped releases it);
* every write is at the ``resourceVersion`` it read, so two takers cannot both win.

A holder whose tenure was interrupted (someone else took the Lease in between, even
briefly) starts a new tenure, and its pool starts empty: what another holder handed out in
between may be above anything it had.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from mcp_epoch_operator.kube import KubeClient, KubeError

log = logging.getLogger("mcp_epoch_operator.lease")

#: The annotation on the Lease naming where the holder takes forwarded admissions.
ADDRESS_ANNOTATION = "mcp.epochs.dev/admission-address"

Step = Literal["create", "renew", "take", "wait"]


@dataclass(frozen=True, slots=True)
class Seen:
    """The Lease as one read found it."""

    holder: str
    transitions: int
    version: str
    address: str | None

    @classmethod
    def of(cls, lease: dict[str, Any]) -> Seen:
        spec = lease.get("spec") or {}
        meta = lease.get("metadata") or {}
        return cls(
            holder=spec.get("holderIdentity") or "",
            transitions=int(spec.get("leaseTransitions") or 0),
            version=str(meta.get("resourceVersion") or ""),
            address=(meta.get("annotations") or {}).get(ADDRESS_ANNOTATION),
        )


def next_step(seen: Seen | None, me: str, unchanged_for: float, duration: float) -> Step:
    """What this process does after a read: ``unchanged_for`` is how long, by its own clock,
    the record has looked the same to it."""
    if seen is None:
        return "create"
    if seen.holder == me:
        return "renew"
    if not seen.holder or unchanged_for >= duration:
        return "take"
    return "wait"


def micro_time(at: float | None = None) -> str:
    """A Kubernetes MicroTime (for people reading the Lease: no decision reads it back)."""
    moment = datetime.fromtimestamp(time.time() if at is None else at, UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class AdmissionLease:
    """One process's side of the admission Lease: its rounds, and whether it holds now."""

    def __init__(
        self,
        kube: KubeClient,
        namespace: str,
        name: str,
        identity: str,
        address: str,
        *,
        duration: float = 4.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.kube = kube
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.address = address
        self.duration = duration
        #: Rounds this often: a holder renews three times within its duration.
        self.every = duration / 4
        #: Handed out no closer than this to the moment others may take over.
        self.margin = duration / 4
        self.clock = clock
        #: A token for this process's current tenure (None: not holding). A pool filled in
        #: one tenure is never handed out in another.
        self.tenure: int | None = None
        self._tenures = 0
        self._held_transitions: int | None = None
        self._valid_until = 0.0
        self._seen: Seen | None = None
        self._seen_since = 0.0
        self._changed = asyncio.Event()
        self._poke = asyncio.Event()

    def holds(self) -> bool:
        """Whether this process may hand out epochs at this instant."""
        return self.clock() < self._valid_until

    @property
    def holder_address(self) -> str | None:
        """Where the holder last seen takes forwarded admissions (None: no holder)."""
        if self.holds():
            return self.address
        seen = self._seen
        if seen is None or not seen.holder or seen.holder == self.identity:
            return None
        return seen.address

    async def changed(self, within: float) -> None:
        """Ask for a round now and wait (at most ``within`` seconds) for what it finds."""
        self._changed.clear()
        self._poke.set()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._changed.wait(), within)

    async def run(self) -> None:
        """Rounds until cancelled; a failed round is logged, and holding lapses on its own."""
        while True:
            try:
                await self.round()
            except (KubeError, OSError, TimeoutError) as exc:
                log.warning("admission lease %s/%s: %s", self.namespace, self.name, exc)
            except Exception:
                # Whatever it was, the rounds go on: a loop that ended here would leave this
                # process never handing out again (and, holding, never releasing).
                log.exception("admission lease %s/%s: a round failed", self.namespace, self.name)
            self._changed.set()
            self._poke.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._poke.wait(), self.every)

    async def round(self) -> None:
        """Read the Lease once, and create, renew or take it when that is this process's to
        do."""
        started = self.clock()
        lease = await self.kube.get_lease(self.namespace, self.name)
        seen = Seen.of(lease) if lease is not None else None
        now = self.clock()
        if (
            seen is None
            or self._seen is None
            or (seen.holder, seen.version)
            != (
                self._seen.holder,
                self._seen.version,
            )
        ):
            self._seen_since = now
        self._seen = seen
        step = next_step(seen, self.identity, now - self._seen_since, self.duration)
        if step == "wait":
            self._lost()
            return
        transitions = 0 if seen is None else seen.transitions
        if step == "take" and seen is not None:
            transitions += 1
        body = self._body(lease, transitions, renew=step == "renew")
        try:
            if step == "create":
                written = await self.kube.create_lease(self.namespace, body)
            else:
                written = await self.kube.replace_lease(self.namespace, body)
        except KubeError as exc:
            if exc.status != 409:
                raise
            self._lost()  # another process wrote first; the next round reads what it wrote
            return
        self._seen = Seen.of(written)
        self._seen_since = self.clock()
        if step != "renew" or self._held_transitions != transitions:
            # Not a continuation of this process's tenure: a new one, with a new token.
            self._tenures += 1
            self.tenure = self._tenures
            self._held_transitions = transitions
            log.info("admission lease %s/%s held by %s", self.namespace, self.name, self.identity)
        self._valid_until = started + self.duration - self.margin

    def _lost(self) -> None:
        if self.tenure is not None:
            log.info("admission lease %s/%s: no longer held here", self.namespace, self.name)
        self.tenure = None
        self._held_transitions = None
        self._valid_until = 0.0

    def _body(
        self, lease: dict[str, Any] | None, transitions: int, *, renew: bool
    ) -> dict[str, Any]:
        meta = dict((lease or {}).get("metadata") or {})
        spec = dict((lease or {}).get("spec") or {})
        now = micro_time()
        annotations = dict(meta.get("annotations") or {})
        annotations[ADDRESS_ANNOTATION] = self.address
        meta.update(name=self.name, namespace=self.namespace, annotations=annotations)
        spec.update(
            holderIdentity=self.identity,
            leaseDurationSeconds=max(1, round(self.duration)),
            renewTime=now,
            leaseTransitions=transitions,
        )
        if not renew or not spec.get("acquireTime"):
            spec["acquireTime"] = now
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": meta,
            "spec": spec,
        }

    async def release(self) -> None:
        """Stop handing out, then empty the Lease so another process takes it at once."""
        held = self.tenure is not None
        self._lost()
        seen = self._seen
        if not held or seen is None or seen.holder != self.identity:
            return
        try:
            lease = await self.kube.get_lease(self.namespace, self.name)
            if lease is None or Seen.of(lease).holder != self.identity:
                return
            lease["spec"]["holderIdentity"] = None
            await self.kube.replace_lease(self.namespace, lease)
            log.info("admission lease %s/%s released", self.namespace, self.name)
        except (KubeError, OSError, TimeoutError) as exc:
            log.warning(
                "admission lease %s/%s not released (%s): another process takes it once it expires",
                self.namespace,
                self.name,
                exc,
            )
