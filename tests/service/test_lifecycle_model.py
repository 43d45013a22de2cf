"""Property-based: the real store (a SQLite file) against a simple model of the lifecycle."""

from __future__ import annotations

import asyncio
import tempfile
from dataclasses import dataclass
from pathlib import Path

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from epochsvc.service.lifecycle import Action, LifecycleError, State
from epochsvc.service.store import SqlEpochStore, UnknownEpoch

_ALLOWED = {
    Action.BIND: {State.PENDING},
    Action.DRAIN: {State.LIVE},
    Action.RETIRE: {State.LIVE, State.DRAINING},
    Action.ABANDON: {State.PENDING},
}
_TARGET = {
    Action.BIND: State.LIVE,
    Action.DRAIN: State.DRAINING,
    Action.RETIRE: State.RETIRED,
    Action.ABANDON: State.ABANDONED,
}


@dataclass
class ModelEpoch:
    uid: str
    state: State = State.PENDING
    pod_uid: str | None = None
    incarnation: int | None = None


class LedgerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.TemporaryDirectory()
        self.loop = asyncio.new_event_loop()
        self.store = self.run(SqlEpochStore.open(f"sqlite:///{Path(self.dir.name)}/l.db"))
        self.model: dict[int, ModelEpoch] = {}
        self.by_uid: dict[str, int] = {}
        self.last_revision = 0

    def run(self, coro):  # type: ignore[no-untyped-def]
        return self.loop.run_until_complete(coro)

    def teardown(self) -> None:
        self.run(self.store.close())
        self.loop.close()
        self.dir.cleanup()

    generations = st.integers(min_value=1, max_value=8)
    pods = st.sampled_from(["pod-a", "pod-b", "pod-c"])

    @rule(uid=st.sampled_from([f"req-{i}" for i in range(8)]))
    def issue(self, uid: str) -> None:
        record, created = self.run(self.store.issue("ns", "srv", uid))
        if uid in self.by_uid:
            assert not created and record.generation == self.by_uid[uid]
        else:
            assert created and record.generation == len(self.model) + 1
            self.by_uid[uid] = record.generation
            self.model[record.generation] = ModelEpoch(uid)
        assert record.state is self.model[record.generation].state

    @rule(gen=generations, action=st.sampled_from(list(Action)), pod=pods)
    def transition(self, gen: int, action: Action, pod: str) -> None:
        expected = self.model.get(gen)
        try:
            record = self.run(
                self.store.transition(gen, action, pod_name=pod, pod_uid=pod)
                if action is Action.BIND
                else self.store.transition(gen, action)
            )
        except UnknownEpoch:
            assert expected is None
            return
        except LifecycleError as exc:
            assert expected is not None
            if exc.code == "pod-already-bound":
                assert any(m.pod_uid == pod for g, m in self.model.items() if g != gen)
            elif exc.code == "pod-mismatch":
                assert expected.pod_uid not in (None, pod)
            else:
                assert exc.code == "illegal-transition"
                assert expected.state not in _ALLOWED[action]
                assert expected.state is not _TARGET[action]
            return
        assert expected is not None
        if expected.state in _ALLOWED[action]:
            expected.state = _TARGET[action]
            if action is Action.BIND:
                expected.pod_uid = pod
        else:  # only a legal repeat may succeed without a change
            assert expected.state is _TARGET[action] or (
                action is Action.BIND and expected.pod_uid == pod
            )
        assert record.state is expected.state
        assert record.pod_uid == expected.pod_uid

    @rule(gen=generations)
    def incarnate(self, gen: int) -> None:
        expected = self.model.get(gen)
        try:
            record = self.run(self.store.register_incarnation(gen))
        except UnknownEpoch:
            assert expected is None
            return
        except LifecycleError as exc:
            assert expected is not None and exc.code == "illegal-transition"
            assert expected.state not in (State.PENDING, State.LIVE)
            return
        assert expected is not None and expected.state in (State.PENDING, State.LIVE)
        expected.incarnation = 0 if expected.incarnation is None else expected.incarnation + 1
        assert record.incarnation == expected.incarnation
        assert record.process_epoch == f"{record.epoch}.{expected.incarnation}"

    @precondition(lambda self: bool(self.model))
    @invariant()
    def ledger_matches_model(self) -> None:
        snap = self.run(self.store.list_server("ns", "srv"))
        assert snap.revision >= self.last_revision  # the revision never goes back
        self.last_revision = snap.revision
        assert {r.generation: (r.state, r.pod_uid, r.incarnation) for r in snap.epochs} == {
            g: (m.state, m.pod_uid, m.incarnation) for g, m in self.model.items()
        }


LedgerMachine.TestCase.settings = settings(max_examples=40, stateful_step_count=30, deadline=None)
test_lifecycle_against_model = LedgerMachine.TestCase
