"""The report's timeline from calls checked by the real checker and replicas as the fleet
records them: what each call came to, where it lands per second, when replicas were replaced."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from epochsvc.demo.client import ClientResult
from epochsvc.demo.timeline import (
    CallSpan,
    Timeline,
    build_timeline,
    per_second,
    result_of,
    summary,
)
from tests.demo.made import ORIGIN, call, replica, timeline_of


def fleet_run() -> Timeline:
    client = ClientResult(
        "c001",
        calls=[
            call(1, "completed", 0.1, 3.2),
            call(2, "completed", 3.3, 6.4, foreign=True),
            call(3, "rejected", 6.5, 6.9),
            call(4, "failed", 7.0, 7.05),
            call(5, "hung", 7.1, 16.1),
            call(6, "pending", 17.0, None),
        ],
        rejected_at=[ORIGIN + 6.8],
        forwarded_at=[ORIGIN + 5.5, ORIGIN + 5.7, ORIGIN + 9.0],
    )
    replicas = [
        replica("r1", -2.0, -1.0, 5.5, 6.2),
        replica("r2", -2.0, -1.0, 8.0, 18.0, killed=True),
        replica("r3", 5.0, 5.4, None, 21.0),  # stopped at teardown, not by the deploy
        replica("r4", None, 8.1, 20.5, None),  # a pod: only serving and out-of-rotation known
    ]
    return timeline_of(client, replicas, deploy=(5.0, 12.0))


def test_each_call_comes_to_what_its_user_saw() -> None:
    tl = fleet_run()
    assert [(c.started, c.ended, c.result) for c in tl.calls] == [
        (0.1, 3.2, "completed"),
        (3.3, 6.4, "corrupted"),  # completed, with a foreign event accepted
        (6.5, 6.9, "failed"),  # rejected: the client was told
        (7.0, 7.05, "failed"),
        (7.1, 16.1, "hung"),
        (17.0, 19.5, "hung"),  # still pending when the run ended: it hung
    ]
    assert tl.rejections == (6.8,) and tl.forwards == (5.5, 5.7, 9.0)
    assert tl.deploy == (5.0, 12.0) and tl.stopped == 18.0


def test_replacements_are_the_deploys_not_the_teardowns() -> None:
    tl = fleet_run()
    assert [(r.name, r.started, r.ready, r.retiring, r.exited, r.killed) for r in tl.replicas] == [
        ("r1", -2.0, -1.0, 5.5, 6.2, False),
        ("r2", -2.0, -1.0, 8.0, 18.0, True),
        ("r3", 5.0, 5.4, None, 21.0, False),
        ("r4", None, 8.1, 20.5, None, False),
    ]
    # r4 left the rotation after the traffic stopped: the end of the run, not a replacement.
    assert tl.replacements == [5.5, 8.0]


def test_bins_start_at_the_deploy_so_fleets_line_up() -> None:
    s = per_second(fleet_run())
    # 0 s is the deploy's start (5.0 after the traffic's); the first bin holds the traffic's.
    assert s.start == -5.0 and s.width == 1.0 and s.lefts[:2] == [-5.0, -4.0]
    assert len(s) == 20  # the last event (the pending call's end) is at 19.5 - 5.0 = 14.5

    def at(series: tuple[int, ...]) -> dict[float, int]:
        return {left: n for left, n in zip(s.lefts, series, strict=True) if n}

    assert at(s.completed) == {-2.0: 1}
    assert at(s.corrupted) == {1.0: 1}
    assert at(s.failed) == {1.0: 1, 2.0: 1}
    assert at(s.hung) == {11.0: 1, 14.0: 1}
    assert at(s.rejections) == {1.0: 1}
    assert at(s.forwards) == {0.0: 2, 4.0: 1}


def test_without_a_deploy_the_axis_starts_with_the_traffic() -> None:
    client = ClientResult("c001", calls=[call(1, "completed", 0.2, 3.7)])
    tl = build_timeline(ORIGIN, [client], [], deploy=None, stopped=ORIGIN + 4.0, ended=ORIGIN + 5)
    s = per_second(tl, width=2.0)
    assert tl.zero == 0.0 and s.start == 0.0 and s.completed == (0, 1, 0)


def test_summary_is_json_and_on_the_deploys_axis() -> None:
    out = json.loads(json.dumps(summary(fleet_run())))
    assert out["deploy_s"] == [0.0, 7.0]
    assert out["replaced_s"] == [0.5, 3.0]
    assert out["traffic_stopped_s"] == 13.0
    per = out["per_second"]
    assert per["start_s"] == -5.0
    assert sum(per["completed"]) + sum(per["corrupted"]) == 2
    assert sum(per["failed"]) == 2 and sum(per["hung"]) == 2


def test_a_call_maps_to_one_result() -> None:
    assert result_of(call(1, "completed", 0, 1)) == "completed"
    assert result_of(call(1, "completed", 0, 1, foreign=True)) == "corrupted"
    assert result_of(call(1, "rejected", 0, 1)) == "failed"
    assert result_of(call(1, "pending", 0, None)) == "hung"


times = st.floats(min_value=0.0, max_value=60.0, allow_nan=False)


@given(
    ends=st.lists(times, max_size=40),
    deploy=st.one_of(st.none(), times),
    width=st.sampled_from([0.5, 1.0, 2.0]),
)
def test_every_event_lands_in_the_bin_that_holds_it(
    ends: list[float], deploy: float | None, width: float
) -> None:
    tl = Timeline(
        calls=tuple(CallSpan(0.0, t, "completed") for t in ends),
        forwards=tuple(ends),
        deploy=None if deploy is None else (deploy, deploy + 1.0),
        stopped=30.0,
    )
    s = per_second(tl, width)
    shifted = [t - tl.zero for t in ends]
    if shifted:
        assert s.lefts[0] <= min(shifted) and max(shifted) < s.lefts[-1] + width
    held = tuple(sum(left <= t < left + width for t in shifted) for left in s.lefts)
    assert s.completed == s.forwards == held
    assert sum(held) == len(ends)
