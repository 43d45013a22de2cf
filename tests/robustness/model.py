"""The epoch ledger as a sequential specification, one server's epochs at a time.

Written apart from the service's own rules (``epochsvc.service.lifecycle``), so that a wrong
rule there is caught here rather than copied. A state is a frozenset of :class:`Rec`, one per
issued ``request_uid``; every step is pure. An operation whose outcome is unknown (it timed
out, its connection broke, or it got a 5xx) may or may not have taken effect, so the model is
nondeterministic: :func:`step` maps one state to every state the operation could leave, and
the checker carries the set of them (the "power set" model, as etcd's robustness suite does).

Operations (input → output; an output of ``None`` is unknown):

* ``("issue", uid)`` → ``("ok", generation)`` or ``("err", code)``: idempotent on ``uid``; a
  new generation is above every one this server has, and never one another uid has.
* ``("bind", gen, pod_uid)``, ``("drain", gen)``, ``("retire", gen)`` → ``("ok", state)`` or
  ``("err", code)``.
* ``("incarnate", gen)`` → ``("ok", n)``: incarnations of a pod epoch are 0, 1, 2, ...
* ``("get", gen)`` → ``("ok", state, newest incarnation)``.
* ``("list",)`` → ``("ok", ((gen, state), ...))`` sorted: every epoch of the server.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

PENDING, LIVE, DRAINING, RETIRED, ABANDONED = "pending", "live", "draining", "retired", "abandoned"
State = frozenset["Rec"]


@dataclass(frozen=True, slots=True)
class Rec:
    uid: str
    gen: int | None  # None: issued by an operation whose answer was lost, generation unseen
    state: str = PENDING
    pod_uid: str | None = None
    newest: int | None = None


INITIAL: State = frozenset()


def _by_gen(s: State, gen: int) -> Rec | None:
    for r in s:
        if r.gen == gen:
            return r
    return None


def _swap(s: State, old: Rec, new: Rec) -> State:
    return (s - {old}) | {new}


def _transition(r: Rec, op: str, pod_uid: str | None) -> tuple[Rec | None, str | None]:
    """(the record after ``op``, or None with the refusal's code)."""
    if op == "bind":
        if r.pod_uid is not None and r.pod_uid != pod_uid:
            return None, "pod-mismatch"
        if r.state in (LIVE, DRAINING, RETIRED):
            return r, None  # a repeat, or a late bind of the same pod: nothing changes
        if r.state != PENDING:
            return None, "illegal-transition"
        return replace(r, state=LIVE, pod_uid=pod_uid), None
    if op == "drain":
        if r.state == DRAINING:
            return r, None
        if r.state != LIVE:
            return None, "illegal-transition"
        return replace(r, state=DRAINING), None
    if op == "retire":
        if r.state == RETIRED:
            return r, None
        if r.state not in (LIVE, DRAINING):
            return None, "illegal-transition"
        return replace(r, state=RETIRED), None
    if op == "incarnate":
        if r.state not in (PENDING, LIVE):
            return None, "illegal-transition"
        return replace(r, newest=0 if r.newest is None else r.newest + 1), None
    raise ValueError(op)


def _pod_taken(s: State, r: Rec, pod_uid: str) -> bool:
    """A pod is bound to one epoch at most (the workload keeps each pod within one server)."""
    return any(o.pod_uid == pod_uid and o is not r for o in s)


def step(s: State, inp: tuple[Any, ...], out: tuple[Any, ...] | None) -> list[State]:
    """Every state ``inp`` with answer ``out`` could leave ``s`` in (none: impossible)."""
    kind = inp[0]
    if kind == "issue":
        return _issue(s, inp[1], out)
    if kind in ("bind", "drain", "retire", "incarnate"):
        r = _by_gen(s, inp[1])
        if r is None:
            return []  # the workload only acts on generations it was told
        after, refused = _transition(r, kind, inp[2] if kind == "bind" else None)
        if kind == "bind" and after is not None and after != r and _pod_taken(s, r, inp[2]):
            after, refused = None, "pod-already-bound"
        if out is None:  # unknown: it happened, or it did not
            return [s] if after is None or after == r else [s, _swap(s, r, after)]
        if refused is not None:
            return [s] if out == ("err", refused) else []
        assert after is not None
        answer = ("ok", after.newest) if kind == "incarnate" else ("ok", after.state)
        return [_swap(s, r, after)] if out == answer else []
    if kind == "get":
        r = _by_gen(s, inp[1])
        if out is None:
            return [s]
        return [s] if r is not None and out == ("ok", r.state, r.newest) else []
    if kind == "list":
        return [s] if out is None or _lists(s, out[1]) else []
    raise ValueError(kind)


def _issue(s: State, uid: str, out: tuple[Any, ...] | None) -> list[State]:
    mine = next((r for r in s if r.uid == uid), None)
    if out is None:
        if mine is not None:
            return [s]
        return [s, s | {Rec(uid, None)}]  # issued with a generation nobody saw, or not at all
    if out[0] != "ok":
        return []  # a well-formed issue is never refused
    gen = out[1]
    if mine is not None:
        if mine.gen == gen:
            return [s]
        if mine.gen is None and _by_gen(s, gen) is None:
            return [_swap(s, mine, replace(mine, gen=gen))]  # the repeat shows the lost answer
        return []
    known = [r.gen for r in s if r.gen is not None]
    if known and gen <= max(known):
        return []
    return [s | {Rec(uid, gen)}]


def _lists(s: State, shown: tuple[tuple[int, str], ...]) -> bool:
    """A list shows every epoch of the server with its state; an epoch issued by an answer
    that was lost may appear under a generation the model never saw (pending, one per such
    issue)."""
    seen = dict(shown)
    if len(seen) != len(shown):
        return False
    unseen = 0
    for r in s:
        if r.gen is None:
            unseen += 1
        elif seen.pop(r.gen, None) != r.state:
            return False
    return len(seen) == unseen and all(state == PENDING for state in seen.values())
