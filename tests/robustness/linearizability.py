"""Is a recorded history linearizable against :mod:`tests.robustness.model`?

The search is Wing and Gong's, with Lowe's cache of (operations linearized, model states)
already explored: the algorithm porcupine implements. It is written here, in Python, because
the model is nondeterministic (an operation whose answer was lost may or may not have
happened) and carries sets of states; the model and its checker then live beside the workload
and the service's own code in one language, and ``make test`` builds no extra toolchain.

A history is split by server (the ledger's epochs of one server never constrain another's,
apart from generations, which :func:`check_generations` checks across the whole history), as
porcupine's partitions do. An operation with an unknown outcome never returned, so it may be
linearized anywhere after its call: its return is placed after every other event.

Outside the search, two checks that need no model:

* generations: two request UIDs never share one, and an issue that completed before another
  began got the lower generation, across servers too;
* revisions: a client is never shown a ledger revision older than one it was already shown.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from tests.robustness import model
from tests.robustness.history import Op


class Undecided(Exception):
    """The search ran out of time: a failure, never a pass."""


@dataclass
class Verdict:
    ok: bool
    problems: list[str]
    partitions: int
    seconds: float


def check(history: list[Op], timeout: float = 120.0) -> Verdict:
    """Check every partition and the cross-partition rules; raises :class:`Undecided` if the
    search does not finish within ``timeout`` seconds."""
    t0 = time.monotonic()
    problems = check_generations(history) + check_revisions(history)
    parts: dict[str, list[Op]] = defaultdict(list)
    for op in history:
        parts[op.server].append(op)
    deadline = t0 + timeout
    for server, ops in sorted(parts.items()):
        bad = _search(ops, deadline)
        if bad is not None:
            problems.append(f"server {server}: not linearizable; {bad}")
    return Verdict(not problems, problems, len(parts), time.monotonic() - t0)


@dataclass(eq=False)
class _Entry:
    op: Op
    index: int
    is_call: bool
    time: float
    match: _Entry | None = None
    prev: _Entry | None = None
    next: _Entry | None = None


def _entries(ops: list[Op]) -> _Entry:
    """A doubly linked list (with a head sentinel) of call and return events in time order;
    at equal times calls come first (intervals are closed)."""
    events: list[_Entry] = []
    for i, op in enumerate(ops):
        call = _Entry(op, i, True, op.called)
        ret = _Entry(op, i, False, math.inf if op.output is None else op.returned)
        call.match = ret
        events += [call, ret]
    events.sort(key=lambda e: (e.time, not e.is_call))
    head = _Entry(ops[0], -1, False, -math.inf)
    prev = head
    for e in events:
        prev.next, e.prev = e, prev
        prev = e
    return head


def _lift(e: _Entry) -> None:
    assert e.prev is not None and e.match is not None and e.match.prev is not None
    e.prev.next = e.next
    if e.next is not None:
        e.next.prev = e.prev
    m = e.match
    m.prev.next = m.next  # type: ignore[union-attr]
    if m.next is not None:
        m.next.prev = m.prev


def _unlift(e: _Entry) -> None:
    m = e.match
    assert m is not None and m.prev is not None and e.prev is not None
    m.prev.next = m
    if m.next is not None:
        m.next.prev = m
    e.prev.next = e
    if e.next is not None:
        e.next.prev = e


def _apply(states: frozenset[model.State], op: Op) -> frozenset[model.State]:
    out: set[model.State] = set()
    for s in states:
        out.update(model.step(s, op.input, op.output))
    return frozenset(out)


def _search(ops: list[Op], deadline: float) -> str | None:
    """None when linearizable; else what could not be placed."""
    if not ops:
        return None
    head = _entries(ops)
    states: frozenset[model.State] = frozenset({model.INITIAL})
    linearized = 0
    cache: set[tuple[int, frozenset[model.State]]] = set()
    calls: list[tuple[_Entry, frozenset[model.State]]] = []
    deepest: tuple[int, Op | None] = (0, None)
    entry = head.next
    steps = 0
    while head.next is not None:
        steps += 1
        if steps % 4096 == 0 and time.monotonic() > deadline:
            raise Undecided(f"the search did not finish in time ({len(ops)} operations)")
        assert entry is not None
        if entry.is_call:
            after = _apply(states, entry.op)
            if after:
                bits = linearized | (1 << entry.index)
                if (bits, after) not in cache:
                    cache.add((bits, after))
                    calls.append((entry, states))
                    states, linearized = after, bits
                    _lift(entry)
                    entry = head.next
                    continue
            entry = entry.next
        else:
            if not calls:
                return f"no order explains {deepest[1]}" if deepest[1] else "no order at all"
            if len(calls) > deepest[0]:
                deepest = (len(calls), entry.op)
            top, states = calls.pop()
            linearized &= ~(1 << top.index)
            _unlift(top)
            entry = top.next
    return None


def check_generations(history: Iterable[Op]) -> list[str]:
    """Generations are never shared by two request UIDs, and never go backwards in real
    time, whichever server they belong to."""
    gen_of: dict[str, int] = {}
    began: dict[str, float] = {}
    done: dict[str, float] = {}
    problems = []
    for op in history:
        if op.input[0] != "issue":
            continue
        uid = op.input[1]
        began[uid] = min(began.get(uid, math.inf), op.called)
        if op.output is None or op.output[0] != "ok":
            continue
        gen = op.output[1]
        if gen_of.setdefault(uid, gen) != gen:
            problems.append(f"request {uid} got generation {gen_of[uid]} and later {gen}")
        done[uid] = min(done.get(uid, math.inf), op.returned)
    owners: dict[int, str] = {}
    for uid, gen in gen_of.items():
        if owners.setdefault(gen, uid) != uid:
            problems.append(f"generation {gen} was issued to {owners[gen]} and to {uid}")
    # Sweep by time: every issue that began after another completed must be above it.
    finished = sorted((t, gen_of[u]) for u, t in done.items())
    starts = sorted((t, u) for u, t in began.items() if u in gen_of)
    highest, i = -1, 0
    for t, uid in starts:
        while i < len(finished) and finished[i][0] < t:
            highest = max(highest, finished[i][1])
            i += 1
        if gen_of[uid] <= highest:
            problems.append(
                f"request {uid} began after generation {highest} was issued, yet got {gen_of[uid]}"
            )
    return problems


def check_revisions(history: Iterable[Op]) -> list[str]:
    """A client is never shown an older ledger revision than one it was shown before."""
    last: dict[int, tuple[float, int]] = {}
    problems = []
    for op in sorted(history, key=lambda o: o.called):
        if op.revision is None:
            continue
        seen = last.get(op.client)
        if seen is not None and seen[0] < op.called and op.revision < seen[1]:
            problems.append(f"client {op.client} was shown revision {op.revision} after {seen[1]}")
        if seen is None or op.revision > seen[1]:
            last[op.client] = (op.returned, op.revision)
    return problems
