"""The short robustness run of ``make test``, and proof that its checker catches bugs.

The full run is ``make robustness`` (``python -m tests.robustness``, 10,000 operations per
history); here each fault gets a shorter history, against the same real processes.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from epochsvc.service.app import create_app
from epochsvc.service.settings import Settings
from tests.robustness import linearizability
from tests.robustness.faults import SCENARIOS, Scenario, run
from tests.robustness.history import Op, load, save
from tests.robustness.workload import Workload
from tests.support.served import served

SHORT = 1500


def _scenario(name: str, backend: str) -> Scenario:
    return next(s for s in SCENARIOS if s.name == name and s.backend == backend)


@pytest.mark.parametrize(
    ("name", "backend"),
    [
        ("kill -9 service, restart", "sqlite"),
        ("kill -9 PostgreSQL, restart", "postgres"),
        ("two services, one killed", "postgres"),
        ("two services, one paused (SIGSTOP)", "postgres"),
        ("partition service | PostgreSQL", "postgres"),
    ],
)
def test_a_fault_leaves_a_linearizable_history(
    name: str, backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    if backend == "postgres":
        request.getfixturevalue("postgres")  # the marker and its installation check
    # The search's own limit is under pytest's, so a search that cannot decide says so.
    result = asyncio.run(run(_scenario(name, backend), SHORT, tmp_path, check_timeout=180))
    assert result.ok, result.problems
    assert result.status_500 == 0
    assert result.operations >= SHORT


# --- the checker catches what it must -------------------------------------------------------


def _op(client: int, inp: tuple[object, ...], out: tuple[object, ...] | None, t0: float,
        t1: float) -> Op:  # fmt: skip
    return Op(client, "s0", inp, out, t0, t1)


def test_a_generation_reused_after_a_restart_is_caught() -> None:
    history = [
        _op(0, ("issue", "a"), ("ok", 5), 0, 1),
        _op(1, ("issue", "b"), ("ok", 5), 2, 3),  # a restarted ledger handed out 5 again
    ]
    verdict = linearizability.check(history)
    assert not verdict.ok and any("generation 5" in p for p in verdict.problems)


def test_a_lost_acknowledged_epoch_is_caught() -> None:
    history = [
        _op(0, ("issue", "a"), ("ok", 5), 0, 1),
        _op(1, ("list",), ("ok", ()), 2, 3),  # after a crash, the acknowledged epoch is gone
    ]
    assert not linearizability.check(history).ok


def test_an_answer_that_was_lost_may_or_may_not_have_happened() -> None:
    history = [
        _op(0, ("issue", "a"), ("ok", 5), 0, 1),
        _op(0, ("drain", 5), None, 2, 3),  # unknown: the bind below says it did not happen
        _op(1, ("bind", 5, "pod-5"), ("ok", "live"), 4, 5),
        _op(1, ("drain", 5), ("ok", "draining"), 6, 7),
        _op(1, ("get", 5), ("ok", "draining", None), 8, 9),
    ]
    assert linearizability.check(history).ok


def test_a_kept_history_checks_the_same_again(tmp_path: Path) -> None:
    history = [
        _op(0, ("issue", "a"), ("ok", 5), 0, 1),
        _op(1, ("list",), ("ok", ((5, "pending"),)), 2, 3),
        _op(1, ("get", 5), None, 4, 5),
    ]
    save(history, tmp_path / "history.jsonl")
    assert load(tmp_path / "history.jsonl") == history
    assert linearizability.check(load(tmp_path / "history.jsonl")).ok


def test_a_read_older_than_a_completed_write_is_caught() -> None:
    history = [
        _op(0, ("issue", "a"), ("ok", 5), 0, 1),
        _op(0, ("bind", 5, "pod-5"), ("ok", "live"), 2, 3),
        _op(0, ("retire", 5), ("ok", "retired"), 4, 5),
        _op(1, ("get", 5), ("ok", "live", None), 6, 7),
    ]
    assert not linearizability.check(history).ok


@contextlib.contextmanager
def _served_with_stale_lookups(url: str, token: str) -> Iterator[str]:
    """The real service, in-process, with a deliberately broken store: ``get`` answers from a
    copy taken the first time each epoch was looked up (a fault no real process here makes
    on demand, so it is injected, and says so)."""
    settings = Settings(
        database_url=url, auth="static", operator_token=token, replica_token="r" + token
    )
    app = create_app(settings)
    with served(app) as url:
        store = app.state.store
        real_get, seen = store.get, {}

        async def stale_get(generation: int):  # type: ignore[no-untyped-def]
            if generation not in seen:
                seen[generation] = await real_get(generation)
            return seen[generation]

        store.get = stale_get
        yield url


def test_a_store_that_serves_stale_reads_fails_the_check(tmp_path: Path) -> None:
    token = "t" * 32
    with _served_with_stale_lookups(f"sqlite:///{tmp_path / 'ledger.db'}", token) as url:
        history = asyncio.run(Workload([url], token, SHORT, workers=8, servers=2).run())
    verdict = linearizability.check(history)
    assert not verdict.ok
    assert any("not linearizable" in p for p in verdict.problems), verdict.problems
