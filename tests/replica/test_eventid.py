"""Property tests of EventId.decode: total on text, strict on format, round-trips."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mcp_epoch._internal.eventid import MAX_EVENT_ID_LEN, MAX_SEQ, EventId
from mcp_epoch.contract import MAX_GENERATION, PodEpoch, ProcessEpoch

# The format, written independently of the implementation.
DEC = r"(0|[1-9][0-9]{0,18})"
FORMAT = re.compile(rf"[0-9a-f]{{8}}-{DEC}\.{DEC}:[1-9][0-9]{{0,18}}")

ledgers = st.text(alphabet="0123456789abcdef", min_size=8, max_size=8)
bounded = st.integers(min_value=0, max_value=MAX_GENERATION)
epochs = st.builds(lambda led, g, i: ProcessEpoch(PodEpoch(led, g), i), ledgers, bounded, bounded)
event_ids = st.builds(EventId, epochs, st.integers(min_value=1, max_value=MAX_SEQ))


def in_format(raw: str) -> bool:
    if FORMAT.fullmatch(raw) is None:
        return False
    nums = re.split(r"[-.:]", raw)[1:]
    return all(int(n) <= MAX_GENERATION for n in nums)


@given(event_ids)
def test_round_trip(eid: EventId) -> None:
    raw = eid.encode()
    assert len(raw) <= MAX_EVENT_ID_LEN
    assert in_format(raw)
    assert EventId.decode(raw) == eid


@given(st.text(max_size=120))
def test_never_crashes_and_accepts_exactly_the_format(raw: str) -> None:
    try:
        eid = EventId.decode(raw)
    except ValueError as exc:
        assert str(exc)
        assert not in_format(raw)
    else:
        assert in_format(raw) and eid.encode() == raw


@given(
    event_ids,
    st.sampled_from(["", " ", "+", "-", "0", "\n", "\u0661", ":", "x", "A"]),
    st.integers(min_value=0, max_value=60),
)
def test_any_insertion_that_leaves_the_format_is_rejected(
    eid: EventId, junk: str, pos: int
) -> None:
    raw = eid.encode()
    pos = min(pos, len(raw))
    mutated = raw[:pos] + junk + raw[pos:]
    if in_format(mutated):
        assert EventId.decode(mutated).encode() == mutated
    else:
        with pytest.raises(ValueError):
            EventId.decode(mutated)


@pytest.mark.parametrize(
    ("raw", "needle"),
    [
        ("", "empty"),
        ("9f2c1a7e-42.0", "no ':'"),
        ("9f2c1a7e-42.0:", "empty seq"),
        ("9f2c1a7e-42.0:0", "positive decimal"),
        ("9f2c1a7e-42.0:007", "leading zeros"),
        ("9f2c1a7e-42.0: 7", "spaces"),
        ("9f2c1a7e-42.0:+7", "sign"),
        ("9f2c1a7e-42.0:99999999999999999999", "positive decimal"),
        ("9f2c1a7e-42.0:9223372036854775808", "larger than"),
        ("9F2C1A7E-42.0:1", "malformed process epoch"),
        ("9f2c1a7e-042.0:1", "malformed process epoch"),
        ("x" * 1000, "characters long"),
    ],
)
def test_messages_name_the_problem(raw: str, needle: str) -> None:
    with pytest.raises(ValueError, match=re.escape(needle.split()[0])):
        EventId.decode(raw)


def test_non_string_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        EventId.decode(b"9f2c1a7e-42.0:1")  # type: ignore[arg-type]
