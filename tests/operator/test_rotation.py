"""When the operator begins a request-state ring rotation, and what it shows, as plain
functions (the service's own rules decide every step after the first)."""

from __future__ import annotations

from typing import Any

from mcp_epoch_operator import rotation

from mcp_epoch.api import RingHolder, RingStatus
from mcp_epoch.contract import ROTATE_ANNOTATION

NOW = 1_800_000_000.0


def ring(phase: str = "steady", behind: list[str] | None = None, **kw: Any) -> RingStatus:
    fields: dict[str, Any] = {
        "namespace": "team",
        "server": "echo",
        "revision": 1,
        "phase": phase,
        "ttl_seconds": 600.0,
        "updated_at": NOW,
        "started_at": None,
        "switched_at": None,
        "drop_due": None,
        "holders": [RingHolder(pod="echo-0", revision=1)],
        "behind": behind or [],
        "waiting": None,
    }
    fields.update(kw)
    return RingStatus(**fields)


def server(
    annotations: dict[str, str] | None = None,
    interval: int | None = None,
    state: dict[str, Any] | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = (
        {"requestState": {"rotationIntervalSeconds": interval}} if interval else {}
    )
    return {
        "metadata": {
            "name": "echo",
            "annotations": annotations or {},
            "creationTimestamp": "2027-01-15T07:00:00Z",  # NOW - 3600 s
        },
        "spec": spec,
        "status": {"requestState": state or {}},
    }


def test_a_new_annotation_value_begins_one_rotation() -> None:
    asked = server({ROTATE_ANNOTATION: "t-1"})
    begin = rotation.due(asked, ring(), NOW)
    assert begin is not None and begin.request == "t-1"
    handled = server({ROTATE_ANNOTATION: "t-1"}, state={"rotationRequest": "t-1"})
    assert rotation.due(handled, ring(), NOW) is None
    assert rotation.due(asked, ring("adding"), NOW) is None  # one rotation at a time
    assert rotation.due(asked, ring(revision=None), NOW) is None  # no ring yet


def test_a_schedule_counts_from_the_last_rotation_begun_or_from_creation() -> None:
    assert rotation.due(server(interval=7200), ring(), NOW) is None  # created an hour ago
    begin = rotation.due(server(interval=3600), ring(), NOW)
    assert begin is not None and begin.request is None and "every 3600s" in begin.why
    recent = {"lastRotationStartedAt": "2027-01-15T07:30:00Z"}
    assert rotation.due(server(interval=3600, state=recent), ring(), NOW) is None
    assert rotation.due(server(interval=0), ring(), NOW + 10**9) is None


def test_the_status_shows_progress_and_a_stall_after_a_minute() -> None:
    lagging = ring("adding", behind=["echo-1"], revision=2, updated_at=NOW - 61)
    begun = rotation.Begin("asked for", "t-1")
    shown = rotation.build_request_state({}, lagging, begun, NOW)
    assert shown["phase"] == "adding" and shown["behind"] == ["echo-1"]
    assert shown["rotationRequest"] == "t-1" and shown["lastRotationStartedAt"]
    cond = rotation.ring_condition([], lagging, NOW, 3)
    assert (cond["status"], cond["reason"]) == ("False", "RotationStalled")
    young = ring("adding", behind=["echo-1"], revision=2, updated_at=NOW - 5)
    assert rotation.ring_condition([], young, NOW, 3)["reason"] == "Rotating"
    assert rotation.ring_condition([], ring(), NOW, 3)["reason"] == "Steady"


def test_a_plain_deployment_is_rotated_only_on_demand() -> None:
    assert rotation.asked({ROTATE_ANNOTATION: "a"}, ring()) is not None
    handled = {ROTATE_ANNOTATION: "a", rotation.HANDLED_ANNOTATION: "a"}
    assert rotation.asked(handled, ring()) is None
    assert rotation.asked({}, ring()) is None


def test_the_operator_looks_again_for_the_drop_on_time_and_otherwise_only_for_the_status() -> None:
    """Steps that wait for pods are the service's (at the last report): no look of the
    operator is needed for them, so it comes back only to show progress, or exactly when the
    one step that waits for time is due."""
    assert rotation.next_look(ring(), None, NOW) is None  # steady: nothing to come back for
    begun = rotation.Begin("asked for", "t-1")
    assert rotation.next_look(ring("adding", revision=2), begun, NOW) == 1.0
    waiting = ring("adding", behind=["echo-1"], revision=2)
    assert rotation.next_look(waiting, None, NOW) == rotation.STATUS_SECONDS
    keeping = ring("switching", revision=3, switched_at=NOW - 100, drop_due=NOW + 500)
    assert rotation.next_look(keeping, None, NOW) == 500.05
    # Due by the operator's clock but not stepped yet (the service's is behind): soon, not
    # in a tight loop.
    late = ring("switching", revision=3, switched_at=NOW - 700, drop_due=NOW - 100)
    assert rotation.next_look(late, None, NOW) == rotation.FIRST_LOOK_SECONDS
