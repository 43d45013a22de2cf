"""Replica library: what an MCP server process links for epoch-safe ``Last-Event-ID`` resumption.

Importable with the core dependencies only (httpx, anyio). The SDK-facing pieces that need the
``mcp`` package (``EpochEventStore``, ``EpochClient``) are imported lazily on first access.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from epochsvc.replica.buffer import BufferedEvent, ReplayBuffer, capacity_from_env
from epochsvc.replica.config import ReplicaConfig
from epochsvc.replica.decision import ReplayPlan, classify, decide, zombie
from epochsvc.replica.errors import (
    REASONS,
    Reason,
    ResumptionEpochMismatch,
    ResumptionGap,
    ResumptionRejected,
)
from epochsvc.replica.eventid import EventId
from epochsvc.replica.guard import REJECTED_HEADER, ResumptionGuard
from epochsvc.replica.liveview import LiveEpochView
from epochsvc.replica.process import ProcessStart, fallback_epoch, start_process_epoch
from epochsvc.replica.sessions import SessionRegistry, SessionTag, current_session
from epochsvc.replica.snapshot import EpochRecord, EpochSnapshot

if TYPE_CHECKING:
    from epochsvc.replica.client import EpochClient
    from epochsvc.replica.store import EpochEventStore

_LAZY = {
    "EpochEventStore": "epochsvc.replica.store",
    "EpochClient": "epochsvc.replica.client",
}

__all__ = [
    "REASONS",
    "REJECTED_HEADER",
    "BufferedEvent",
    "EpochClient",
    "EpochEventStore",
    "EpochRecord",
    "EpochSnapshot",
    "EventId",
    "LiveEpochView",
    "ProcessStart",
    "Reason",
    "ReplayBuffer",
    "ReplayPlan",
    "ReplicaConfig",
    "ResumptionEpochMismatch",
    "ResumptionGap",
    "ResumptionGuard",
    "ResumptionRejected",
    "SessionRegistry",
    "SessionTag",
    "capacity_from_env",
    "classify",
    "current_session",
    "decide",
    "fallback_epoch",
    "start_process_epoch",
    "zombie",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'epochsvc.replica' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
