"""The rotation of a request-state key ring, as plain functions: each step only once every
live pod holds the current revision, the old key kept one TTL after every pod sealed anew."""

from __future__ import annotations

import pytest

from epochsvc.service import keyring
from epochsvc.service.keyring import Holder, Phase, RotationInProgress

A, B = b"a" * 32, b"b" * 32


def ring(now: float = 100.0) -> keyring.Ring:
    return keyring.Ring("ns", "echo", 1, Phase.STEADY, (A,), 60.0, now)


def at(revision: int | None, *pods: str) -> list[Holder]:
    return [Holder(p, revision) for p in pods]


def test_a_rotation_walks_the_sdk_phases_in_order_of_the_keys() -> None:
    adding = keyring.start_rotation(ring(), 110.0, B)
    assert (adding.phase, adding.keys, adding.revision) == (Phase.ADDING, (A, B), 2)

    step = keyring.advance(adding, at(2, "p0", "p1"), 120.0)
    switching = step.ring
    assert step.advanced and (switching.phase, switching.keys) == (Phase.SWITCHING, (B, A))
    assert switching.revision == 3 and switching.switched_at is None

    observed = keyring.advance(switching, at(3, "p0", "p1"), 130.0)
    assert observed.advanced and observed.ring.switched_at == 130.0
    assert observed.ring.keys == (B, A) and observed.ring.revision == 3
    assert keyring.drop_due(observed.ring) == 190.0

    early = keyring.advance(observed.ring, at(3, "p0", "p1"), 189.9)
    assert not early.advanced and early.ring.keys == (B, A) and early.waiting

    done = keyring.advance(observed.ring, at(3, "p0", "p1"), 190.0)
    assert done.advanced and (done.ring.phase, done.ring.keys) == (Phase.STEADY, (B,))
    assert done.ring.revision == 4 and done.ring.started_at is None


@pytest.mark.parametrize("phase_steps", [0, 1, 2])
def test_one_pod_behind_holds_every_step_and_is_named(phase_steps: int) -> None:
    current = keyring.start_rotation(ring(), 110.0, B)
    for _ in range(phase_steps):
        current = keyring.advance(current, at(current.revision, "p0", "p1"), 200.0).ring
    pods = [Holder("p0", current.revision), Holder("p1", current.revision - 1), Holder("p2", None)]
    step = keyring.advance(current, pods, 10_000.0)
    assert not step.advanced and step.ring == current
    assert step.behind == ("p1", "p2")
    assert step.waiting is not None and "2 of 3 pods" in step.waiting


def test_a_steady_ring_stays_and_a_second_rotation_waits_for_the_first() -> None:
    steady = ring()
    assert keyring.advance(steady, at(None, "p0"), 500.0).ring == steady
    adding = keyring.start_rotation(steady, 110.0)
    assert len(adding.keys) == 2 and adding.keys[0] == A and len(adding.keys[1]) == 32
    with pytest.raises(RotationInProgress):
        keyring.start_rotation(adding, 111.0)


def test_a_ring_never_shows_its_keys_when_printed() -> None:
    text = repr(keyring.start_rotation(ring(), 110.0, B))
    assert "aaaa" not in text and "bbbb" not in text and "keys=2" in text
