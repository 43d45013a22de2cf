"""An immutable copy of the ledger's epochs for one server, at one ledger revision.

The resume decision reads only a snapshot, never the network, so every replica holding the
same revision classifies the same cursor the same way.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from mcp_epoch.contract import State


@dataclass(frozen=True, slots=True)
class EpochRecord:
    """What the ledger says about one pod epoch (only the fields the decision needs)."""

    epoch: str
    state: State
    incarnation: int | None  # newest registered incarnation, or None
    address: str | None = None  # host:port the pod serves on (from the API server), or None
    #: The handoff rule: the sessions of incarnation ``successor_of`` went to the process
    #: epoch ``successor``.
    successor: str | None = None
    successor_of: int | None = None


def _empty() -> Mapping[str, EpochRecord]:
    return MappingProxyType({})


@dataclass(frozen=True, slots=True)
class EpochSnapshot:
    """Epochs of one server keyed by pod epoch; ``ledger_id`` is None until the first sync."""

    ledger_id: str | None = None
    revision: int = -1
    epochs: Mapping[str, EpochRecord] = field(default_factory=_empty)

    @property
    def ledger8(self) -> str | None:
        return None if self.ledger_id is None else self.ledger_id[:8]

    @classmethod
    def of(cls, ledger_id: str, revision: int, records: list[EpochRecord]) -> EpochSnapshot:
        return cls(ledger_id, revision, MappingProxyType({r.epoch: r for r in records}))
