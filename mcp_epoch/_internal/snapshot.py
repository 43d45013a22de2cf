"""An immutable copy of the ledger's epochs for one server, at one ledger revision.

The resume decision reads only a snapshot, never the network, so every replica holding the
same revision classifies the same cursor the same way.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from mcp_epoch.contract import STATES, State


@dataclass(frozen=True, slots=True)
class EpochRecord:
    """What the ledger says about one pod epoch (only the fields the decision needs)."""

    epoch: str
    state: State
    incarnation: int | None  # newest registered incarnation, or None
    address: str | None = None  # host:port the pod serves on (from the API server), or None

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> EpochRecord:
        epoch = obj.get("epoch")
        state = obj.get("state")
        inc = obj.get("incarnation")
        address = obj.get("address")
        if not isinstance(epoch, str):
            raise ValueError(f"epoch object without a string 'epoch': {obj!r:.200}")
        if state not in STATES:
            raise ValueError(f"epoch {epoch}: unknown state {state!r}")
        if inc is not None and (isinstance(inc, bool) or not isinstance(inc, int) or inc < 0):
            raise ValueError(f"epoch {epoch}: bad incarnation {inc!r}")
        if address is not None and (not isinstance(address, str) or not 0 < len(address) <= 300):
            raise ValueError(f"epoch {epoch}: bad address {address!r:.100}")
        return cls(epoch, state, inc, address)


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
    def from_json(cls, obj: Mapping[str, Any]) -> EpochSnapshot:
        """Parse the body of ``GET /v1/servers/{ns}/{server}/epochs``."""
        ledger_id = obj.get("ledger_id")
        revision = obj.get("revision")
        items = obj.get("epochs")
        if not isinstance(ledger_id, str) or len(ledger_id) < 8:
            raise ValueError(f"epoch list without a ledger_id: {ledger_id!r}")
        if isinstance(revision, bool) or not isinstance(revision, int):
            raise ValueError(f"epoch list without an integer revision: {revision!r}")
        if not isinstance(items, list):
            raise ValueError("epoch list without an 'epochs' array")
        records = {}
        for item in items:
            if not isinstance(item, Mapping):
                raise ValueError(f"epoch entry is not an object: {item!r:.200}")
            rec = EpochRecord.from_json(item)
            records[rec.epoch] = rec
        return cls(ledger_id, revision, MappingProxyType(records))

    @classmethod
    def of(cls, ledger_id: str, revision: int, records: list[EpochRecord]) -> EpochSnapshot:
        return cls(ledger_id, revision, MappingProxyType({r.epoch: r for r in records}))
