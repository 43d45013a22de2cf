"""An in-memory copy of the ledger's epochs, so lookups, lists and long polls never wait on
the database.

Only the event loop thread mutates it. Every record carries the revision of its last change,
so applying updates in any order converges: a record is replaced only by a newer one.
"""

from __future__ import annotations

from collections.abc import Iterable

from epochsvc.service.lifecycle import State
from epochsvc.service.store.base import EpochRecord


class LedgerMirror:
    def __init__(self) -> None:
        self.records: dict[int, EpochRecord] = {}
        self.revision = 0
        # False while the copy may have missed changes (e.g. the listener lost PostgreSQL):
        # readers then go to the database instead.
        self.synced = False

    def apply(self, records: Iterable[EpochRecord], revision: int) -> bool:
        """Take newer versions of these records; True if anything changed."""
        changed = False
        for record in records:
            current = self.records.get(record.generation)
            if current is None or record.revision > current.revision:
                self.records[record.generation] = record
                changed = True
        if revision > self.revision:
            self.revision = revision
            changed = True
        return changed

    def replace(self, records: Iterable[EpochRecord], revision: int) -> bool:
        """A full snapshot at ``revision``: also forget what it no longer holds (compacted),
        unless that changed after the snapshot was taken."""
        snapshot = {r.generation: r for r in records}
        changed = self.apply(snapshot.values(), revision)
        for generation, record in list(self.records.items()):
            if generation not in snapshot and record.revision <= revision:
                del self.records[generation]
                changed = True
        self.synced = True
        return changed

    def list(self, namespace: str, server: str, states: set[State]) -> list[EpochRecord]:
        return sorted(
            (
                r
                for r in self.records.values()
                if r.namespace == namespace
                and r.server == server
                and (not states or r.state in states)
            ),
            key=lambda r: r.generation,
        )

    def bound_to(self, pod_uid: str) -> EpochRecord | None:
        return next((r for r in self.records.values() if r.pod_uid == pod_uid), None)

    def server_revision(self, namespace: str, server: str) -> int:
        return max(
            (
                r.revision
                for r in self.records.values()
                if r.namespace == namespace and r.server == server
            ),
            default=0,
        )
