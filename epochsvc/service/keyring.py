"""The request-state key ring of one MCP server, and its rotation, as plain functions.

MCP 2026-07-28 servers seal the ``requestState`` of a multi-round-trip request under a key
ring: ``keys[0]`` seals, every key opens. A client's retry may reach any replica, so every
replica of a server must hold a ring that opens what any other sealed. A rotation therefore
moves through the SDK's three phases, and each step waits until **every** live pod reports
that it holds the ring of the current phase (observation, never a timer):

1. ``adding``: ``[current, next]``. Pods learn to open the next key; nobody seals with it.
2. ``switching``: ``[next, current]``. Once every pod opens ``next``, pods seal with it. The
   old key stays until every pod was seen sealing with ``next`` (``switched_at``, the time of
   that observation) and one state TTL has passed since: only then has every state sealed
   under the old key expired.
3. back to ``steady``: ``[next]``.

Every step bumps the ring's revision; pods report the revision they hold. A pod that does not
catch up stops the rotation where it is, which is always safe: no step ever removes a key a
live pod may still seal with, or one a state that is still valid was sealed under.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from dataclasses import dataclass, replace
from enum import StrEnum

#: Bytes of fresh randomness per key (the SDK asks for at least 32).
KEY_BYTES = 32


class Phase(StrEnum):
    STEADY = "steady"
    ADDING = "adding"
    SWITCHING = "switching"


class RotationInProgress(Exception):
    """A rotation was asked for while one is under way (it must finish first)."""


@dataclass(frozen=True, slots=True)
class Ring:
    namespace: str
    server: str
    revision: int
    phase: Phase
    keys: tuple[bytes, ...]  # keys[0] seals
    ttl: float  # seconds a sealed state stays valid
    updated_at: float
    started_at: float | None = None  # when the rotation under way began
    switched_at: float | None = None  # when every live pod was first seen sealing with keys[0]

    def __repr__(self) -> str:  # never the keys, wherever a ring is printed or logged
        return (
            f"Ring({self.namespace}/{self.server} revision={self.revision} "
            f"phase={self.phase.value} keys={len(self.keys)})"
        )


@dataclass(frozen=True, slots=True)
class Holder:
    """One live pod epoch of the server, and the ring revision its newest process reported
    (``None``: no report from that process yet)."""

    pod: str
    revision: int | None


@dataclass(frozen=True, slots=True)
class Step:
    """What one attempt to advance found: the ring after it, and what it waits for."""

    ring: Ring
    advanced: bool
    waiting: str | None = None
    behind: tuple[str, ...] = ()


def new_key() -> bytes:
    return secrets.token_bytes(KEY_BYTES)


def new_ring(namespace: str, server: str, ttl: float, now: float) -> Ring:
    return Ring(namespace, server, 1, Phase.STEADY, (new_key(),), ttl, now)


def start_rotation(ring: Ring, now: float, key: bytes | None = None) -> Ring:
    """``steady`` → ``adding``: a fresh key joins the ring, after the one that seals.

    Always safe (a key that nobody seals with yet only opens more); the steps after it wait
    for the pods."""
    if ring.phase is not Phase.STEADY:
        raise RotationInProgress(
            f"a rotation of {ring.namespace}/{ring.server} is under way ({ring.phase.value}, "
            f"revision {ring.revision})"
        )
    fresh = key if key is not None else new_key()
    return replace(
        ring,
        revision=ring.revision + 1,
        phase=Phase.ADDING,
        keys=(ring.keys[0], fresh),
        started_at=now,
        switched_at=None,
        updated_at=now,
    )


def behind(ring: Ring, holders: Sequence[Holder]) -> tuple[str, ...]:
    """The pods that have not reported holding this revision of the ring."""
    return tuple(sorted(h.pod for h in holders if h.revision is None or h.revision < ring.revision))


def advance(ring: Ring, holders: Sequence[Holder], now: float) -> Step:
    """At most one step of the rotation, given every live pod of the server now."""
    if ring.phase is Phase.STEADY:
        return Step(ring, False)
    late = behind(ring, holders)
    if late:
        return Step(
            ring,
            False,
            f"{len(late)} of {len(holders)} pods do not hold ring revision {ring.revision} yet",
            late,
        )
    if ring.phase is Phase.ADDING:
        switched = replace(
            ring,
            revision=ring.revision + 1,
            phase=Phase.SWITCHING,
            keys=(ring.keys[1], ring.keys[0]),
            updated_at=now,
        )
        return Step(switched, True)
    if ring.switched_at is None:
        observed = replace(ring, switched_at=now, updated_at=now)
        return Step(observed, True, _keeping(observed))
    if now < ring.switched_at + ring.ttl:
        return Step(ring, False, _keeping(ring))
    done = replace(
        ring,
        revision=ring.revision + 1,
        phase=Phase.STEADY,
        keys=ring.keys[:1],
        started_at=None,
        switched_at=None,
        updated_at=now,
    )
    return Step(done, True)


def drop_due(ring: Ring) -> float | None:
    """When the old key may leave the ring (``None``: not known yet, or nothing to drop)."""
    if ring.phase is not Phase.SWITCHING or ring.switched_at is None:
        return None
    return ring.switched_at + ring.ttl


def _keeping(ring: Ring) -> str:
    return (
        f"every pod seals with the new key; the old key still opens states sealed before, "
        f"for {ring.ttl:g}s after {ring.switched_at:.0f}"
    )
