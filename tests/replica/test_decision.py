"""The resume decision against a deliberately naive reference model (hypothesis)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mcp_epoch._internal.buffer import ReplayBuffer
from mcp_epoch._internal.decision import decide
from mcp_epoch._internal.errors import ResumptionEpochMismatch, ResumptionGap, ResumptionRejected
from mcp_epoch._internal.snapshot import EpochRecord, EpochSnapshot
from mcp_epoch.contract import FALLBACK_INCARNATION_MIN, PodEpoch, ProcessEpoch

LEDGER = "9f2c1a7e00112233445566778899aabb"
OWN = ProcessEpoch(PodEpoch("9f2c1a7e", 42), 1)
OWNERS = ["A", "B"]
STREAMS = ["1", "2", "_GET_stream"]


@dataclass(frozen=True)
class Ev:
    seq: int
    owner: str
    stream: str
    msg: Any


def model(
    cursor: tuple[ProcessEpoch, int],
    events: list[Ev],
    capacity: int,
    view: dict[str, tuple[str, int | None]],
    ledger8: str | None,
    owner: str | None,
) -> tuple[str, list[int]]:
    """Spec, written out plainly: returns ("replay", seqs) or ("reject", reason)."""
    epoch, seq = cursor

    def rec(pod: PodEpoch) -> tuple[str, int | None] | None:
        if ledger8 is None or pod.ledger8 != ledger8:
            return None
        return view.get(str(pod))

    own = rec(OWN.pod)
    if own is not None and (
        own[0] in ("retired", "abandoned") or (own[1] is not None and own[1] > OWN.incarnation)
    ):
        return "reject", ["retired"]  # type: ignore[list-item]
    if epoch != OWN:
        r = (
            None
            if epoch.pod.generation == 0 or epoch.incarnation >= FALLBACK_INCARNATION_MIN
            else rec(epoch.pod)
        )
        if r is None or r[1] is None or epoch.incarnation > r[1]:
            reason = "unknown"
        elif r[0] in ("retired", "abandoned") or epoch.incarnation < r[1]:
            reason = "retired"
        elif r[0] == "draining":
            reason = "draining"
        else:
            reason = "live-elsewhere"
        return "reject", [reason]  # type: ignore[list-item]
    if seq > len(events):
        return "reject", ["unknown"]  # type: ignore[list-item]
    if owner is None:
        return "reject", ["unknown"]  # type: ignore[list-item]
    if seq <= len(events) - capacity:
        return "reject", ["gap"]  # type: ignore[list-item]
    at = events[seq - 1]
    if at.owner != owner:
        return "reject", ["unknown"]  # type: ignore[list-item]
    return "replay", [
        e.seq
        for e in events
        if e.seq > seq and e.owner == owner and e.stream == at.stream and e.msg is not None
    ]


states = st.sampled_from(["pending", "live", "draining", "retired", "abandoned"])
incs = st.none() | st.integers(min_value=0, max_value=3)
views = st.dictionaries(
    st.sampled_from(["9f2c1a7e-41", "9f2c1a7e-42", "9f2c1a7e-43"]),
    st.tuples(states, incs),
    max_size=3,
)
cursor_epochs = st.one_of(
    st.just(OWN),
    st.builds(
        lambda g, i: ProcessEpoch(PodEpoch("9f2c1a7e", g), i),
        st.integers(min_value=40, max_value=44),
        st.integers(min_value=0, max_value=4),
    ),
    st.builds(lambda i: ProcessEpoch(PodEpoch("0badbeef", 42), i), st.integers(0, 3)),
    st.just(ProcessEpoch(PodEpoch("9f2c1a7e", 42), FALLBACK_INCARNATION_MIN + 5)),
    st.just(ProcessEpoch(PodEpoch("9f2c1a7e", 0), 7)),
)
event_lists = st.lists(
    st.tuples(st.sampled_from(OWNERS), st.sampled_from(STREAMS), st.none() | st.integers()),
    max_size=40,
)


@settings(max_examples=400, deadline=None)
@given(
    event_lists,
    st.integers(min_value=1, max_value=12),
    views,
    st.sampled_from([LEDGER, None, "0badbeef" + "0" * 24]),
    cursor_epochs,
    st.integers(min_value=1, max_value=45),
    st.sampled_from([*OWNERS, None]),
)
def test_decide_matches_the_reference_model(
    raw_events: list[tuple[str, str, Any]],
    capacity: int,
    view: dict[str, tuple[str, int | None]],
    ledger_id: str | None,
    epoch: ProcessEpoch,
    seq: int,
    owner: str | None,
) -> None:
    buf = ReplayBuffer(capacity)
    events = []
    for o, s, m in raw_events:
        events.append(Ev(buf.append(o, s, m), o, s, m))
    snap = (
        EpochSnapshot()
        if ledger_id is None
        else EpochSnapshot.of(ledger_id, 7, [EpochRecord(k, v[0], v[1]) for k, v in view.items()])
    )  # type: ignore[arg-type]
    expected = model(
        (epoch, seq), events, capacity, view, None if ledger_id is None else ledger_id[:8], owner
    )
    cursor = f"{epoch}:{seq}"
    try:
        plan = decide(cursor, OWN, buf, snap, owner)
    except ResumptionRejected as exc:
        assert expected == ("reject", [exc.reason])
        if exc.reason == "gap":
            assert isinstance(exc, ResumptionGap)
        if epoch != OWN and exc.reason != "gap":
            assert isinstance(exc, ResumptionEpochMismatch)
    else:
        assert expected == ("replay", [e.seq for e in plan.events])
        assert plan.upto == buf.next_seq


def test_malformed_is_a_value_error_before_anything_else() -> None:
    with pytest.raises(ValueError):
        decide("9f2c1a7e-42.1:01", OWN, ReplayBuffer(3), EpochSnapshot(), "A")


def test_buffer_memory_is_bounded_and_replay_is_the_exact_suffix() -> None:
    buf = ReplayBuffer(100)
    for i in range(100_000):
        buf.append("A", "s", i)
    assert len(buf._messages) == 100 and len(buf._owners) == 100 and len(buf) == 100
    plan = decide(f"{OWN}:{100_000 - 10}", OWN, buf, EpochSnapshot(), "A")
    assert [e.message for e in plan.events] == list(range(100_000 - 10, 100_000))
    with pytest.raises(ResumptionGap):
        decide(f"{OWN}:{100_000 - 100}", OWN, buf, EpochSnapshot(), "A")


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=1, max_value=8), st.integers(min_value=0, max_value=30))
def test_message_of_reads_exactly_what_get_reads(capacity: int, appended: int) -> None:
    """The writer's lookup (``message_of``, spelt out for speed) holds the same events as
    ``get``: nothing evicted, never issued, zero or negative."""
    buf = ReplayBuffer(capacity)
    for i in range(appended):
        buf.append("A", "s", f"m{i + 1}")
    for seq in range(-2, appended + 3):
        got = buf.get(seq)
        assert buf.message_of(seq) == (None if got is None else got.message)
