"""Event IDs: ``<process epoch>:<seq>``.

An event ID is only meaningful inside the process epoch that minted it, so the epoch is part of
the ID and decoding is strict: a cursor that is not exactly in the format is never guessed at.
The epoch formats themselves live in :mod:`mcp_epoch.contract` (shared with service and operator).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from mcp_epoch.contract import (
    MAX_DECIMAL_DIGITS,
    MAX_GENERATION,
    MAX_PROCESS_EPOCH_LEN,
    ProcessEpoch,
)

MAX_SEQ = MAX_GENERATION
# Longest event ID: longest process epoch, ':' and a 19-digit seq. Checked before any parsing,
# so a hostile header costs O(1) to reject.
MAX_EVENT_ID_LEN = MAX_PROCESS_EPOCH_LEN + 1 + MAX_DECIMAL_DIGITS
_SEQ_RE = re.compile(rf"\A[1-9][0-9]{{0,{MAX_DECIMAL_DIGITS - 1}}}\Z")


@dataclass(frozen=True, slots=True, order=True)
class EventId:
    """One SSE event ID: the process epoch that minted it and its 1-based sequence number."""

    epoch: ProcessEpoch
    seq: int

    def __post_init__(self) -> None:
        if not isinstance(self.epoch, ProcessEpoch):
            raise ValueError(f"epoch must be a ProcessEpoch, not {type(self.epoch).__name__}")
        if isinstance(self.seq, bool) or not isinstance(self.seq, int):
            raise ValueError(f"seq must be an int, not {type(self.seq).__name__}")
        if not 1 <= self.seq <= MAX_SEQ:
            raise ValueError(f"seq {self.seq} is outside 1..{MAX_SEQ}")

    def encode(self) -> str:
        return f"{self.epoch}:{self.seq}"

    def __str__(self) -> str:
        return self.encode()

    @classmethod
    def decode(cls, raw: str) -> EventId:
        """Parse a ``Last-Event-ID`` value; raise ``ValueError`` naming what is wrong."""
        if not isinstance(raw, str):
            raise ValueError(f"an event ID must be a string, not {type(raw).__name__}")
        if not raw:
            raise ValueError("empty event ID")
        if len(raw) > MAX_EVENT_ID_LEN:
            raise ValueError(f"event ID is {len(raw)} characters long, at most {MAX_EVENT_ID_LEN}")
        epoch_text, sep, seq_text = raw.rpartition(":")
        if not sep:
            raise ValueError(f"event ID {raw!r} has no ':' between process epoch and seq")
        if not seq_text:
            raise ValueError(f"event ID {raw!r} has an empty seq after ':'")
        if _SEQ_RE.match(seq_text) is None:
            raise ValueError(
                f"event ID {raw!r}: seq {seq_text!r} is not a positive decimal integer "
                "without sign, spaces or leading zeros"
            )
        seq = int(seq_text)
        if seq > MAX_SEQ:
            raise ValueError(f"event ID {raw!r}: seq is larger than {MAX_SEQ}")
        try:
            epoch = ProcessEpoch.parse(epoch_text)
        except ValueError as exc:
            raise ValueError(f"event ID {raw!r}: {exc}") from None
        return cls(epoch, seq)
