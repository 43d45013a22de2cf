"""A bounded ring buffer of the events this process sent, indexed by sequence number.

One buffer per process: sequence numbers are global (unique across sessions and streams), so a
cursor locates its event in O(1) (slot ``seq % capacity``) and eviction is strictly oldest-first.
That gives the exact gap rule the decision needs: the continuation of a cursor is complete iff
the cursor's own event is still buffered. Memory is ``capacity`` slots, whatever the uptime.

The ring keeps columns (owner, stream, message, final), not an object per event: an append
allocates nothing the cyclic garbage collector tracks. Events live for the whole window, so
every tracked object they held was walked by every collection until it was evicted (bench
guard: the collector's time per call was 2.5 times the SDK's own). The store keeps each message
as the JSON text it is sent as, for the same reason (see ``EpochEventStore.store_event``).
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any, Final, NamedTuple

from mcp_epoch.contract import DEFAULT_BUFFER_EVENTS

MAX_CAPACITY: Final = 10_000_000


class BufferedEvent(NamedTuple):
    """One sent event, as read back. ``owner`` is the session tag, ``message`` is ``None`` for
    priming events; ``final``: the message ends its stream (a response or an error). Its ID is
    the store's to make from ``seq`` (made again on the rare replay rather than kept: a string
    per event held for the whole window, and freed cold when evicted)."""

    seq: int
    owner: Hashable | None
    stream_id: str
    message: Any
    final: bool = False


def check_capacity(capacity: int) -> int:
    if isinstance(capacity, bool) or not isinstance(capacity, int):
        raise ValueError(f"buffer capacity must be an int, not {type(capacity).__name__}")
    if not 1 <= capacity <= MAX_CAPACITY:
        raise ValueError(f"buffer capacity {capacity} is outside 1..{MAX_CAPACITY}")
    return capacity


class ReplayBuffer:
    """Fixed-size ring of events, read back as :class:`BufferedEvent`: O(1) append, memory
    fixed at creation."""

    __slots__ = ("_capacity", "_finals", "_messages", "_owners", "_streams", "next_seq")

    def __init__(self, capacity: int = DEFAULT_BUFFER_EVENTS) -> None:
        self._capacity = check_capacity(capacity)
        self._owners: list[Hashable | None] = [None] * self._capacity
        self._streams: list[str] = [""] * self._capacity
        self._messages: list[Any] = [None] * self._capacity
        self._finals: list[bool] = [False] * self._capacity
        #: The seq the next append gets; everything below it has been issued. Read it, never
        #: set it (an attribute, not a property: the store reads it for every event).
        self.next_seq = 1

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def oldest_seq(self) -> int:
        """The oldest seq still buffered (== ``next_seq`` when empty)."""
        return max(1, self.next_seq - self._capacity)

    def __len__(self) -> int:
        return self.next_seq - self.oldest_seq

    def append(
        self,
        owner: Hashable | None,
        stream_id: str,
        message: Any,
        final: bool = False,
    ) -> int:
        seq = self.next_seq
        i = seq % self._capacity
        self._owners[i] = owner
        self._streams[i] = stream_id
        self._messages[i] = message
        self._finals[i] = final
        self.next_seq = seq + 1
        return seq

    def _event(self, seq: int) -> BufferedEvent:
        i = seq % self._capacity
        return BufferedEvent(
            seq, self._owners[i], self._streams[i], self._messages[i], self._finals[i]
        )

    def get(self, seq: int) -> BufferedEvent | None:
        """The event with this seq if still buffered, else ``None`` (evicted or never issued)."""
        if not self.oldest_seq <= seq < self.next_seq:
            return None
        return self._event(seq)

    def message_of(self, seq: int) -> Any:
        """The message kept for event ``seq`` while it is buffered, else ``None``. The range
        ``get`` reads, spelt out: the SDK's writer asks this for every event it sends, and the
        :attr:`oldest_seq` property was a second call in Python each time."""
        end = self.next_seq
        if 0 < seq < end and seq >= end - self._capacity:
            return self._messages[seq % self._capacity]
        return None

    def is_evicted(self, seq: int) -> bool:
        return 1 <= seq < self.oldest_seq

    def matching(
        self, after: int, owner: Hashable | None, stream_id: str, upto: int | None = None
    ) -> list[BufferedEvent]:
        """Buffered events with ``after < seq < upto`` that carry a message and belong to
        (owner, stream), in order. The caller has checked that ``after + 1`` is not evicted."""
        stop = self.next_seq if upto is None else min(upto, self.next_seq)
        start = max(after + 1, self.oldest_seq)
        streams, owners, messages = self._streams, self._owners, self._messages
        cap = self._capacity
        return [
            self._event(seq)
            for seq in range(start, stop)
            if streams[i := seq % cap] == stream_id
            and owners[i] == owner
            and messages[i] is not None
        ]

    def by_owner(self, owners: set[Hashable]) -> dict[Hashable, list[BufferedEvent]]:
        """Every buffered event (priming events too) of each of ``owners``, in seq order: one
        pass over the ring, however many sessions hand on at once."""
        out: dict[Hashable, list[BufferedEvent]] = {o: [] for o in owners}
        held, cap = self._owners, self._capacity
        for seq in range(self.oldest_seq, self.next_seq):
            owner = held[seq % cap]
            if owner in out:
                out[owner].append(self._event(seq))
        return out
