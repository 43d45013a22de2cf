"""The storage interface of the ledger; the API and the sweeper depend only on this."""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from epochsvc.service.keyring import Holder, Ring, Step
from epochsvc.service.lifecycle import Action, State
from mcp_epoch.contract import ProcessEpoch


class UnknownEpoch(LookupError):
    """The epoch was never issued by this ledger (or its tombstone was compacted)."""


class RequestConflict(Exception):
    """The same admission request UID was used for a different namespace or server."""


class StoreUnavailable(Exception):
    """The database cannot be reached; callers answer 503 and may retry."""


@dataclass(frozen=True, slots=True)
class EpochRecord:
    ledger8: str
    generation: int
    namespace: str
    server: str
    request_uid: str
    state: State
    pod_name: str | None
    pod_uid: str | None
    incarnation: int | None
    revision: int
    created_at: float
    updated_at: float
    address: str | None = None  # host:port the pod serves on, written by the operator
    #: The handoff rule: the sessions of incarnation ``successor_of`` went to the process
    #: epoch ``successor`` (recorded once, by that process itself, while it drained).
    successor: str | None = None
    successor_of: int | None = None

    @property
    def epoch(self) -> str:
        return f"{self.ledger8}-{self.generation}"

    @property
    def process_epoch(self) -> str | None:
        return None if self.incarnation is None else f"{self.epoch}.{self.incarnation}"


@dataclass(frozen=True, slots=True)
class ServerSnapshot:
    revision: int
    epochs: list[EpochRecord]


@dataclass(slots=True)
class CommitStats:
    """Where a group commit's time goes, summed since start (``/metrics``, ``bench service``):
    per commit, the writes it carried, the statements it sent, the round trips they took
    (BEGIN, COMMIT and the writer's ping after an idle spell included; several statements
    share one in a pipeline), and the writer's time from BEGIN to the end of COMMIT."""

    commits: int = 0
    writes: int = 0
    statements: int = 0
    round_trips: int = 0
    seconds: float = 0.0


@dataclass(frozen=True, slots=True)
class SweepResult:
    abandoned: int
    compacted: int


class EpochStore(abc.ABC):
    """A durable ledger. Every method is one transaction; every change bumps the revision."""

    ledger_id: str
    #: Told, on the event loop, of changes this process did not make (another service
    #: process's writes), so that long polls wake without polling the database: the servers
    #: they touched with the newest revision of each, or None when that is not known (a
    #: reload of the whole copy).
    on_change: Callable[[dict[tuple[str, str], int] | None], None] | None = None

    @property
    def ledger8(self) -> str:
        return self.ledger_id[:8]

    @abc.abstractmethod
    async def attach(self) -> None:
        """Start background work on the running event loop (the one that serves requests)."""

    @abc.abstractmethod
    async def issue(
        self, namespace: str, server: str, request_uid: str
    ) -> tuple[EpochRecord, bool]:
        """Issue a pod epoch, or return the one already issued for ``request_uid`` (bool: new)."""

    @abc.abstractmethod
    async def transition(
        self,
        generation: int,
        action: Action,
        *,
        pod_name: str | None = None,
        pod_uid: str | None = None,
        address: str | None = None,
    ) -> EpochRecord: ...

    @abc.abstractmethod
    async def register_incarnation(
        self,
        generation: int,
        *,
        pod_uid: str | None = None,
        pod_name: str | None = None,
        owner_only: bool = False,
    ) -> EpochRecord:
        """The next incarnation. ``owner_only``: the epoch must already be bound to
        ``pod_uid`` (a pod registering for itself); else a ``pod_uid`` given must not
        contradict the binding, nor a ``pod_name``."""

    @abc.abstractmethod
    async def record_handoff(
        self,
        generation: int,
        incarnation: int,
        successor: ProcessEpoch,
        *,
        pod_uid: str | None = None,
    ) -> EpochRecord:
        """Process ``incarnation`` of this pod epoch hands its sessions to ``successor``: a
        live process of the same server in another pod. Recorded once; the same rule again is
        a no-op, another one ``handoff-recorded``. ``pod_uid`` (a pod acting for itself): the
        epoch must be bound to it."""

    @abc.abstractmethod
    async def bound_to(self, pod_uid: str) -> EpochRecord | None:
        """The epoch bound to this pod UID, if any (one per pod: a pod's env never changes)."""

    @abc.abstractmethod
    async def get(self, generation: int) -> EpochRecord: ...

    @abc.abstractmethod
    async def list_server(
        self, namespace: str, server: str, states: Iterable[State] = ()
    ) -> ServerSnapshot: ...

    @abc.abstractmethod
    async def server_revision(self, namespace: str, server: str) -> tuple[int, int]:
        """(newest change revision of this server's epochs, the ledger revision)."""

    @abc.abstractmethod
    async def sweep(
        self, now: float, pending_timeout: float, tombstone_ttl: float
    ) -> SweepResult: ...

    @abc.abstractmethod
    def commit_stats(self) -> CommitStats:
        """The group committer's running totals (read without a lock: for metrics)."""

    @abc.abstractmethod
    async def state_counts(self) -> list[tuple[str, str, str, int]]:
        """(namespace, server, state, count) for every non-empty group, for metrics."""

    @abc.abstractmethod
    async def ping(self) -> None: ...

    # --- request-state key rings (keyring.py) -------------------------------------------

    @abc.abstractmethod
    async def ring(self, namespace: str, server: str, ttl: float) -> Ring:
        """The server's ring; made (steady, one fresh key, ``ttl``) the first time it is asked
        for."""

    @abc.abstractmethod
    async def ring_status(self, namespace: str, server: str) -> tuple[Ring | None, list[Holder]]:
        """The ring (``None`` if never made) and every live pod with the revision it holds."""

    @abc.abstractmethod
    async def ring_revision(self, namespace: str, server: str) -> int:
        """The ring's revision (0 if never made): what a long poll on the ring compares."""

    @abc.abstractmethod
    async def ring_revisions(self) -> dict[tuple[str, str], int]:
        """Every ring's revision, by (namespace, server), in one read."""

    @abc.abstractmethod
    async def report_ring(self, generation: int, incarnation: int, revision: int) -> Step:
        """The pod epoch's process ``incarnation`` holds ring ``revision`` now; a report that
        leaves no live pod behind steps the rotation (``advanced``; the ring is after it)."""

    @abc.abstractmethod
    async def rotate_ring(
        self, namespace: str, server: str, ttl: float
    ) -> tuple[Ring, list[Holder]]:
        """Begin a rotation (RotationInProgress while one is under way); the ring after it and
        every live pod, read in the same transaction."""

    @abc.abstractmethod
    async def advance_ring(
        self, namespace: str, server: str, ttl: float
    ) -> tuple[Step, list[Holder]]:
        """At most one step of a rotation under way, if every live pod has caught up; with the
        live pods it was decided on."""

    @abc.abstractmethod
    async def close(self) -> None: ...
