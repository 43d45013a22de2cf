"""Rejections of a resumption attempt.

A rejection is not a transport error: the client must not retry the same cursor, it must fail
what is pending and start a fresh session. ``reason`` is machine-readable and goes on the wire.
"""

from __future__ import annotations

from mcp_epoch.contract import REASONS, Reason

__all__ = ["REASONS", "Reason", "ResumptionEpochMismatch", "ResumptionGap", "ResumptionRejected"]


class ResumptionRejected(Exception):
    """A cursor that cannot be resumed here; the client must re-initialize."""

    reason: Reason

    def __init__(self, reason: Reason, detail: str = "") -> None:
        if reason not in REASONS:
            raise ValueError(f"unknown rejection reason {reason!r}")
        self.reason = reason
        self.detail = detail
        super().__init__(f"resumption rejected ({reason})" + (f": {detail}" if detail else ""))


class ResumptionEpochMismatch(ResumptionRejected):
    """The cursor belongs to another epoch (or this process is a zombie)."""


class ResumptionGap(ResumptionRejected):
    """Same epoch, but the events after the cursor are no longer buffered: never clamp."""

    def __init__(self, detail: str = "") -> None:
        super().__init__("gap", detail)
