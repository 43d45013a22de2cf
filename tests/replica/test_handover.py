"""What moves with a session (handover.py) and the cursor rule for handed sessions
(decision.decide_handed), as pure functions: every case, exactly."""

from __future__ import annotations

import json

import pytest

from mcp_epoch._internal import handover
from mcp_epoch._internal.adopt import refusal
from mcp_epoch._internal.decision import decide_handed
from mcp_epoch._internal.errors import ResumptionGap, ResumptionRejected
from mcp_epoch._internal.eventid import EventId
from mcp_epoch._internal.handover import HandedSession, Tail, TailEvent
from mcp_epoch._internal.snapshot import EpochRecord, EpochSnapshot
from mcp_epoch.contract import ProcessEpoch

A = ProcessEpoch.parse("0123abcd-4.0")
B = ProcessEpoch.parse("0123abcd-9.2")
# a's tail from seq 10: a priming event, a call on stream "7" ending in its answer, and an
# event of stream "8" between them.
TAIL_A = Tail(
    A,
    10,
    (
        TailEvent(11, "7", None),
        TailEvent(12, "7", '{"p":1}'),
        TailEvent(14, "8", '{"other":1}'),
        TailEvent(15, "7", '{"p":2}'),
        TailEvent(16, "7", '{"result":1}'),
    ),
)
TAIL_B = Tail(B, 1, (TailEvent(3, "_GET_stream", '{"n":1}'),))


def test_a_cursor_inside_the_tail_gets_exactly_the_rest_of_its_stream() -> None:
    plan = decide_handed(EventId(A, 12), [TAIL_A, TAIL_B])
    assert plan.stream_id == "7" and [e.seq for e in plan.events] == [15, 16]
    assert plan.tail.event_id(16) == f"{A}:16"
    # From the priming event: every message of the stream.
    assert [e.seq for e in decide_handed(EventId(A, 11), [TAIL_A]).events] == [12, 15, 16]
    # The last event of a stream: nothing more, not an error.
    assert decide_handed(EventId(A, 16), [TAIL_A]).events == ()
    # A later owner's tail is used for its own cursors only.
    assert decide_handed(EventId(B, 3), [TAIL_A, TAIL_B]).stream_id == "_GET_stream"


@pytest.mark.parametrize(
    ("cursor", "reason"),
    [
        (EventId(A, 9), "gap"),  # evicted before the hand-on
        (EventId(A, 13), "unknown"),  # within the tail's span, not this session's
        (EventId(A, 99), "unknown"),  # after the hand-on: a never saw it in this session
        (EventId(ProcessEpoch.parse("0123abcd-4.1"), 12), "unknown"),  # a's next process
        (EventId(ProcessEpoch.parse("0123abcd-5.0"), 12), "unknown"),  # never held it
    ],
)
def test_any_other_old_cursor_is_rejected_never_mapped(cursor: EventId, reason: str) -> None:
    with pytest.raises(ResumptionRejected) as caught:
        decide_handed(cursor, [TAIL_A, TAIL_B])
    assert caught.value.reason == reason
    assert isinstance(caught.value, ResumptionGap) == (reason == "gap")


def test_what_moves_survives_the_wire_exactly() -> None:
    session = HandedSession(
        f"{A}_{'ab' * 16}",
        "/mcp",
        "example.com:8080",
        b'{"jsonrpc":"2.0","id":0,"method":"initialize","params":{}}',
        "2025-11-25",
        "warning",
        (TAIL_A, TAIL_B),
    )
    sender, sessions = handover.decode(handover.encode(B, [session]))
    assert sender == B and sessions == [session]
    assert handover.decode_answer(handover.encode_answer(["x"], {"y": "why"})) == (
        ["x"],
        {"y": "why"},
    )


def _wire(**change: object) -> bytes:
    session: dict[str, object] = {
        "id": "s",
        "path": "/mcp",
        "initialize": "{}",
        "tails": [{"epoch": str(A), "oldest": 1, "events": [{"seq": 2, "stream": "1"}]}],
    }
    session.update(change)
    return json.dumps({"sender": str(B), "sessions": [session]}).encode()


@pytest.mark.parametrize(
    "body",
    [
        b"{",
        b'{"sender": "x", "sessions": []}',
        _wire(path="mcp"),  # not a path
        _wire(unexpected=1),
        _wire(protocol_version=2025),  # wrong type: never coerced
        _wire(tails=[{"epoch": str(A), "oldest": 5, "events": [{"seq": 2, "stream": "1"}]}]),
        _wire(
            tails=[
                {
                    "epoch": str(A),
                    "oldest": 1,
                    "events": [{"seq": 3, "stream": "1"}, {"seq": 2, "stream": "1"}],
                }
            ]
        ),
        _wire(tails=[{"epoch": str(A), "oldest": 1, "events": []}] * (handover.MAX_TAILS + 1)),
    ],
)
def test_a_malformed_hand_on_is_refused_whole(body: bytes) -> None:
    with pytest.raises(ValueError):
        handover.decode(body)


def _view(successor: str | None, of: int | None, address: str | None) -> EpochSnapshot:
    rec = EpochRecord(str(A.pod), "draining", 0, address, successor, of)
    return EpochSnapshot.of("0123abcd" + "0" * 24, 7, [rec])


def test_a_hand_on_is_taken_only_as_the_ledger_records_it() -> None:
    ok = _view(str(B), 0, "10.0.0.4:8080")
    assert refusal(ok, A, B, "10.0.0.4") is None
    assert refusal(ok, A, B, "10.0.0.5") is not None  # not from a's address
    assert refusal(ok, A, ProcessEpoch.parse("0123abcd-9.3"), "10.0.0.4") is not None
    assert refusal(_view(str(B), 1, "10.0.0.4:8080"), A, B, "10.0.0.4") is not None
    assert refusal(_view(None, None, "10.0.0.4:8080"), A, B, "10.0.0.4") is not None
    assert refusal(_view(str(B), 0, None), A, B, "10.0.0.4") is not None
    assert refusal(EpochSnapshot(), A, B, "10.0.0.4") is not None
