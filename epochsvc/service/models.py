"""The API shapes of ledger records. The bodies themselves are :mod:`mcp_epoch.api`'s models,
the ones every client parses with; only the mapping from the store's records lives here."""

from __future__ import annotations

from typing import Any

from epochsvc.service.store.base import EpochRecord
from mcp_epoch.api import Epoch


def fields_of(r: EpochRecord) -> dict[str, Any]:
    """The API fields of a ledger record (the ones :class:`~mcp_epoch.api.Epoch` has)."""
    return {
        "epoch": r.epoch,
        "generation": r.generation,
        "namespace": r.namespace,
        "server": r.server,
        "state": r.state,
        "pod_name": r.pod_name,
        "pod_uid": r.pod_uid,
        "incarnation": r.incarnation,
        "process_epoch": r.process_epoch,
        "revision": r.revision,
        "address": r.address,
        "successor": r.successor,
        "successor_of": r.successor_of,
        "created_at": r.created_at,
        "updated_at": r.updated_at,
    }


def epoch_of(r: EpochRecord) -> Epoch:
    return Epoch(**fields_of(r))
