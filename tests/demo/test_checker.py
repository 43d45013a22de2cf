"""The checker on hand-made event sequences: good, foreign, duplicated, missing."""

from __future__ import annotations

from epochsvc.demo.checker import CallCheck, Tally, Token


def tok(n: int, kind: str = "step", uid: str = "c1s1", call: str = "k1") -> str:
    return Token(uid, call, kind, n, "r1").encode()  # type: ignore[arg-type]


def run(events: list[tuple[str, str]], steps: int = 4, asks: int = 1) -> CallCheck:
    c = CallCheck("c1s1", "k1", steps, asks)
    for text, kind in events:
        c.accept(text, kind)  # type: ignore[arg-type]
    return c


GOOD = [
    (tok(1), "step"),
    (tok(2), "step"),
    (tok(1, "ask"), "ask"),
    (tok(3), "step"),
    (tok(4), "step"),
    (tok(4, "done"), "done"),
]


def test_token_round_trip_and_garbage() -> None:
    t = Token("c1s1", "k1", "ask", 3, "naive-r2")
    assert Token.parse(t.encode()) == t
    for junk in (None, "", "step 3", "a|b|step|x|r", "a|b|nope|1|r", "a|b|step|1"):
        assert Token.parse(junk) is None


def test_known_good_sequence_is_clean() -> None:
    c = run(GOOD)
    c.finish("completed")
    assert c.clean and (c.foreign, c.duplicated, c.missing) == (0, 0, 0)


def test_foreign_events_are_counted() -> None:
    events = [*GOOD[:2], (tok(3, uid="c9s1"), "step"), (tok(3, call="k2"), "step"), *GOOD[2:]]
    c = run(events)
    c.finish("completed")
    assert c.foreign == 2 and c.duplicated == 0 and c.missing == 0
    # What crossed is kept, for the run's dump: the report says what, not only how many.
    assert c.crossed == [f"step: {tok(3, uid='c9s1')}", f"step: {tok(3, call='k2')}"]


def test_only_the_first_foreign_texts_are_kept() -> None:
    c = run([(tok(n, call="k2"), "step") for n in range(1, 10)], steps=9)
    assert c.foreign == 9 and len(c.crossed) == 5 and c.crossed[0] == f"step: {tok(1, call='k2')}"


def test_foreign_result_and_unparseable_message() -> None:
    c = run([*GOOD[:-1], (tok(4, "done", uid="c2s1"), "done")])
    c.accept("not a token", "step")
    c.finish("completed")
    assert c.foreign == 2


def test_duplicates_are_counted() -> None:
    c = run([*GOOD[:2], (tok(1), "step"), (tok(2), "step"), *GOOD[2:]])
    c.finish("completed")
    assert c.duplicated == 2 and c.foreign == 0 and c.missing == 0


def test_missing_in_the_middle_and_at_the_end() -> None:
    c = run([(tok(1), "step"), (tok(3), "step"), (tok(4, "done"), "done")])
    c.finish("completed")
    # step 2 skipped, step 4 and the question never came, yet the call "completed"
    assert c.missing == 3 and c.foreign == 0


def test_rejected_call_needs_only_a_clean_prefix() -> None:
    c = run(GOOD[:2])
    c.finish("rejected")
    assert c.clean


def test_reconnect_classification() -> None:
    c = CallCheck("c1s1", "k1", 4, 0)
    c.accept(tok(1), "step")
    c.reconnected(True, 200)  # same process, resumes exactly
    c.accept(tok(2), "step")
    c.reconnected(False, 200)  # another process "resumes" with someone else's events
    c.accept(tok(7, uid="c5s1"), "step")
    c.reconnected(False, 404)  # rejected
    c.finish("rejected")
    same, cross, rejected = c.reconnects
    assert same.lossless is True and cross.lossless is False and rejected.lossless is None
    t = Tally()
    t.add_session([c])
    assert (t.same_process_lossless, t.cross_process_resumed, t.reconnects_rejected) == (1, 1, 1)
    assert t.corrupted_sessions == 1 and t.rejected_calls == 1


def test_hung_call_counts_its_resumptions_as_failed() -> None:
    c = CallCheck("c1s1", "k1", 4, 0)
    c.accept(tok(1), "step")
    c.reconnected(False, 200)
    c.reconnected(True, 200)
    c.finish("hung")
    assert [rc.lossless for rc in c.reconnects] == [False, False]
    t = Tally()
    t.add_session([c])
    assert t.hung == 1 and t.lossy == 2 and t.corrupted_sessions == 0


def test_only_a_drop_the_scenario_made_excuses_a_call_cut_before_its_first_event() -> None:
    refused_then_cut = CallCheck("c1s1", "k1", 4, 0)
    refused_then_cut.refused = True  # its first POST was refused; the retry was then cut
    refused_then_cut.drop_hit()
    refused_then_cut.failed_with(RuntimeError("Connection closed"))
    broken_by_a_replica = CallCheck("c2s1", "k1", 4, 0)  # same error, but no drop cut it
    broken_by_a_replica.failed_with(RuntimeError("Connection closed"))
    dropped_later = CallCheck("c3s1", "k1", 4, 0)
    dropped_later.accept(tok(1, uid="c3s1"), "step")
    dropped_later.drop_hit()  # it had an event: the client can resume, the drop is no excuse
    dropped_later.failed_with(RuntimeError("Connection closed"))
    t = Tally()
    for c in (refused_then_cut, broken_by_a_replica, dropped_later):
        t.add_session([c])
    assert [c.cut_before_first_event for c in (refused_then_cut, broken_by_a_replica)] == [
        True,
        False,
    ]
    assert (t.cut_before_first_event, t.refused_calls, t.lost_in_flight) == (1, 0, 2)
