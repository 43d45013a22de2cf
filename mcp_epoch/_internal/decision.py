"""THE resume decision: one pure function of (cursor, own epoch, buffer, live view, session),
and its refinement for sessions handed over from another process (:func:`decide_handed`).

Nothing here does I/O or reads a clock, so the guard, the store and the property tests all run
the very same rule (docs/design.md, "The resume decision").
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from mcp_epoch._internal.buffer import BufferedEvent, ReplayBuffer
from mcp_epoch._internal.errors import (
    Reason,
    ResumptionEpochMismatch,
    ResumptionGap,
    ResumptionRejected,
)
from mcp_epoch._internal.eventid import EventId
from mcp_epoch._internal.handover import Tail, TailEvent
from mcp_epoch._internal.snapshot import EpochSnapshot
from mcp_epoch.contract import ProcessEpoch


@dataclass(frozen=True, slots=True)
class ReplayPlan:
    """Accepted: send ``events`` (in order) on ``stream_id``; ``upto`` is the buffer's next seq
    when decided, so a replayer can pick up anything appended while it was sending."""

    cursor: EventId
    stream_id: str
    events: tuple[BufferedEvent, ...]
    upto: int


def classify(view: EpochSnapshot, epoch: ProcessEpoch) -> Reason:
    """Why a cursor minted by another process epoch cannot be resumed here."""
    if epoch.is_fallback or view.ledger8 is None or epoch.pod.ledger8 != view.ledger8:
        return "unknown"
    rec = view.epochs.get(str(epoch.pod))
    if rec is None or rec.incarnation is None or epoch.incarnation > rec.incarnation:
        return "unknown"
    if rec.state in ("retired", "abandoned") or epoch.incarnation < rec.incarnation:
        return "retired"
    return "draining" if rec.state == "draining" else "live-elsewhere"


def zombie(view: EpochSnapshot, own: ProcessEpoch) -> bool:
    """True when the ledger says this very process is dead (epoch retired or superseded)."""
    if view.ledger8 is None or own.pod.ledger8 != view.ledger8 or own.pod.generation == 0:
        return False
    rec = view.epochs.get(str(own.pod))
    if rec is None:
        return False
    if rec.state in ("retired", "abandoned"):
        return True
    return not own.is_fallback and rec.incarnation is not None and rec.incarnation > own.incarnation


def decide(
    cursor: str | EventId,
    own: ProcessEpoch,
    buffer: ReplayBuffer,
    view: EpochSnapshot,
    owner: Hashable | None,
) -> ReplayPlan:
    """Replay plan for ``Last-Event-ID: cursor`` in session ``owner``, or raise.

    Raises ``ValueError`` (malformed cursor), :class:`ResumptionEpochMismatch` (other epoch, or
    this process is a zombie), :class:`ResumptionGap` (continuation evicted) or
    :class:`ResumptionRejected` with reason ``unknown`` (a seq this process never issued, or an
    event of another session: never replayed, and not revealed either). ``owner`` ``None`` means
    "session unknown": always rejected, so a misconfigured server refuses instead of leaking.
    """
    event_id = cursor if isinstance(cursor, EventId) else EventId.decode(cursor)
    if zombie(view, own):
        raise ResumptionEpochMismatch("retired", f"this process's epoch {own} is retired")
    if event_id.epoch != own:
        reason = classify(view, event_id.epoch)
        raise ResumptionEpochMismatch(reason, f"cursor epoch {event_id.epoch} is not {own}")
    if event_id.seq >= buffer.next_seq:
        raise ResumptionRejected("unknown", f"seq {event_id.seq} was never issued here")
    if owner is None:
        raise ResumptionRejected("unknown", "no session to resume")
    event = buffer.get(event_id.seq)
    if event is None:
        raise ResumptionGap(
            f"event {event_id.seq} was evicted (oldest buffered is {buffer.oldest_seq})"
        )
    if event.owner != owner:
        raise ResumptionRejected("unknown", "the cursor is not from this session")
    upto = buffer.next_seq
    events = tuple(buffer.matching(event_id.seq, owner, event.stream_id, upto))
    return ReplayPlan(event_id, event.stream_id, events, upto)


@dataclass(frozen=True, slots=True)
class TailPlan:
    """Accepted from a handed-over tail: send ``events`` of ``tail`` on ``stream_id``; the
    stream ended (a call's answer is among them or before the cursor) or goes on live under
    the new owner's IDs (the standalone stream)."""

    cursor: EventId
    tail: Tail
    stream_id: str
    events: tuple[TailEvent, ...]


def decide_handed(cursor: EventId, tails: Sequence[Tail]) -> TailPlan:
    """The resume decision for a cursor of an earlier owner of a session this process holds now.

    The cursor is served only from that owner's own tail, under its own IDs, and only when the
    tail provably holds everything after it: the cursor's own event is in the tail (so is
    every later event of the session, by how a tail is made). A cursor below the tail is a
    ``gap``; one of an owner that handed this session nothing, or of another session, is
    ``unknown``. Nothing is re-numbered, mapped or clamped.
    """
    tail = next((t for t in tails if t.epoch == cursor.epoch), None)
    if tail is None:
        raise ResumptionEpochMismatch(
            "unknown", f"process {cursor.epoch} handed this session nothing"
        )
    if cursor.seq < tail.oldest:
        raise ResumptionGap(
            f"event {cursor.seq} of {tail.epoch} was evicted before the session was handed on "
            f"(its tail starts at {tail.oldest})"
        )
    at = next((i for i, e in enumerate(tail.events) if e.seq == cursor.seq), None)
    if at is None:
        raise ResumptionRejected("unknown", "the cursor is not from this session")
    stream = tail.events[at].stream_id
    after = tuple(e for e in tail.events[at + 1 :] if e.stream_id == stream and e.data is not None)
    return TailPlan(cursor, tail, stream, after)
