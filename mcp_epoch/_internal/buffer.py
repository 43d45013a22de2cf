"""A bounded ring buffer of the events this process sent, indexed by sequence number.

One buffer per process: sequence numbers are global (unique across sessions and streams), so a
cursor locates its event in O(1) (slot ``seq % capacity``) and eviction is strictly oldest-first.
That gives the exact gap rule the decision needs: the continuation of a cursor is complete iff
the cursor's own event is still buffered. Memory is ``capacity`` slots, whatever the uptime.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any, Final, NamedTuple

from mcp_epoch.contract import DEFAULT_BUFFER_EVENTS

MAX_CAPACITY: Final = 10_000_000


class BufferedEvent(NamedTuple):
    """One sent event. ``owner`` is the session tag, ``message`` is ``None`` for priming events;
    ``event_id`` is the encoded ID when the store keeps it (encoded once, replayed many times)."""

    seq: int
    owner: Hashable | None
    stream_id: str
    message: Any
    event_id: str = ""


def check_capacity(capacity: int) -> int:
    if isinstance(capacity, bool) or not isinstance(capacity, int):
        raise ValueError(f"buffer capacity must be an int, not {type(capacity).__name__}")
    if not 1 <= capacity <= MAX_CAPACITY:
        raise ValueError(f"buffer capacity {capacity} is outside 1..{MAX_CAPACITY}")
    return capacity


class ReplayBuffer:
    """Fixed-size ring of :class:`BufferedEvent`: O(1) append, memory fixed at creation."""

    __slots__ = ("_capacity", "_next_seq", "_slots")

    def __init__(self, capacity: int = DEFAULT_BUFFER_EVENTS) -> None:
        self._capacity = check_capacity(capacity)
        self._slots: list[BufferedEvent | None] = [None] * self._capacity
        self._next_seq = 1

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def next_seq(self) -> int:
        """The seq the next append gets; everything below it has been issued."""
        return self._next_seq

    @property
    def oldest_seq(self) -> int:
        """The oldest seq still buffered (== ``next_seq`` when empty)."""
        return max(1, self._next_seq - self._capacity)

    def __len__(self) -> int:
        return self._next_seq - self.oldest_seq

    def append(
        self, owner: Hashable | None, stream_id: str, message: Any, event_id: str = ""
    ) -> int:
        seq = self._next_seq
        self._slots[seq % self._capacity] = BufferedEvent(seq, owner, stream_id, message, event_id)
        self._next_seq = seq + 1
        return seq

    def get(self, seq: int) -> BufferedEvent | None:
        """The event with this seq if still buffered, else ``None`` (evicted or never issued)."""
        if not self.oldest_seq <= seq < self._next_seq:
            return None
        return self._slots[seq % self._capacity]

    def is_evicted(self, seq: int) -> bool:
        return 1 <= seq < self.oldest_seq

    def matching(
        self, after: int, owner: Hashable | None, stream_id: str, upto: int | None = None
    ) -> list[BufferedEvent]:
        """Buffered events with ``after < seq < upto`` that carry a message and belong to
        (owner, stream), in order. The caller has checked that ``after + 1`` is not evicted."""
        stop = self._next_seq if upto is None else min(upto, self._next_seq)
        start = max(after + 1, self.oldest_seq)
        if start >= stop:
            return []
        cap = self._capacity
        a, b = start % cap, (stop - 1) % cap + 1
        # At most two contiguous runs of the ring; slicing beats per-seq modulo arithmetic.
        window = self._slots[a:b] if a < b else self._slots[a:] + self._slots[:b]
        return [
            ev
            for ev in window
            if ev is not None
            and ev.message is not None
            and ev.stream_id == stream_id
            and ev.owner == owner
        ]

    def by_owner(self, owners: set[Hashable]) -> dict[Hashable, list[BufferedEvent]]:
        """Every buffered event (priming events too) of each of ``owners``, in seq order: one
        pass over the ring, however many sessions hand on at once."""
        out: dict[Hashable, list[BufferedEvent]] = {o: [] for o in owners}
        for seq in range(self.oldest_seq, self._next_seq):
            ev = self._slots[seq % self._capacity]
            if ev is not None and ev.owner in out:
                out[ev.owner].append(ev)
        return out
