"""The pure parts of forwarding and drain: session IDs, owner routes, calls in flight."""

from __future__ import annotations

import anyio
import pytest

from mcp_epoch._internal.forward import MAX_MOVES, live_peers, route_for, route_to, successor_of
from mcp_epoch._internal.guard import SESSION_HEADER, _with_session
from mcp_epoch._internal.inflight import InFlight
from mcp_epoch._internal.sessionid import SessionId
from mcp_epoch._internal.snapshot import EpochRecord, EpochSnapshot
from mcp_epoch.contract import ProcessEpoch

LEDGER = "9f2c1a7e" + "0" * 24
A = ProcessEpoch.parse("9f2c1a7e-1.0")
B = ProcessEpoch.parse("9f2c1a7e-2.3")


def view(*records: EpochRecord) -> EpochSnapshot:
    return EpochSnapshot.of(LEDGER, 10, list(records))


def test_a_session_id_names_its_owner_and_keeps_the_sdk_id() -> None:
    sid = SessionId.decode(f"{A}_0123456789abcdef0123456789abcdef")
    assert sid.owner == A and sid.local == "0123456789abcdef0123456789abcdef"
    assert SessionId.decode(sid.encode()) == sid
    for bad in ("0123456789abcdef", f"{A}_", f"{A}_a b", "nothex-1.0_abc", f"{A}_" + "a" * 200):
        with pytest.raises(ValueError):
            SessionId.decode(bad)


def test_only_that_very_process_of_a_live_or_draining_pod_is_a_route() -> None:
    live = EpochRecord("9f2c1a7e-2", "live", 3, "10.0.0.2:8080")
    assert route_to(view(live), B) is not None
    assert route_to(view(live), B).address == "10.0.0.2:8080"  # type: ignore[union-attr]
    draining = EpochRecord("9f2c1a7e-2", "draining", 3, "10.0.0.2:8080")
    assert route_to(view(draining), B) is not None
    # An older or newer incarnation, a tombstone, no address, another ledger: no route.
    assert route_to(view(EpochRecord("9f2c1a7e-2", "live", 4, "10.0.0.2:8080")), B) is None
    assert route_to(view(EpochRecord("9f2c1a7e-2", "retired", 3, "10.0.0.2:8080")), B) is None
    assert route_to(view(EpochRecord("9f2c1a7e-2", "live", 3, None)), B) is None
    other = EpochSnapshot.of("00000000" + "0" * 24, 1, [live])
    assert route_to(other, B) is None
    assert route_to(EpochSnapshot(), B) is None


def test_a_session_goes_to_its_owner_while_it_lives_then_down_the_handoff_rules() -> None:
    c = ProcessEpoch.parse("9f2c1a7e-3.0")
    a_draining = EpochRecord("9f2c1a7e-1", "draining", 0, "10.0.0.1:8080", str(B), 0)
    a_retired = EpochRecord("9f2c1a7e-1", "retired", 0, "10.0.0.1:8080", str(B), 0)
    b_live = EpochRecord("9f2c1a7e-2", "live", 3, "10.0.0.2:8080")
    b_retired = EpochRecord("9f2c1a7e-2", "retired", 3, "10.0.0.2:8080", str(c), 3)
    c_live = EpochRecord("9f2c1a7e-3", "live", 0, "10.0.0.3:8080")
    # The owner itself while it drains (it sends on what it handed over) ...
    assert route_for(view(a_draining, b_live), A).epoch == A  # type: ignore[union-attr]
    # ... then its successor, and the successor's, as each is retired in turn.
    assert route_for(view(a_retired, b_live), A).epoch == B  # type: ignore[union-attr]
    assert route_for(view(a_retired, b_retired, c_live), A).epoch == c  # type: ignore[union-attr]
    assert successor_of(view(a_retired), A) == B
    # A rule is one process's: not its pod's next process, and a crash records none.
    assert successor_of(view(a_retired), ProcessEpoch.parse("9f2c1a7e-1.1")) is None
    crashed = EpochRecord("9f2c1a7e-1", "retired", 0, "10.0.0.1:8080")
    assert route_for(view(crashed, b_live), A) is None
    # The chain ends where no one lives, and a loop (which the ledger never records) ends.
    assert route_for(view(a_retired, b_retired), A) is None
    loop = [
        EpochRecord("9f2c1a7e-1", "retired", 0, None, str(B), 0),
        EpochRecord("9f2c1a7e-2", "retired", 3, None, str(A), 3),
    ]
    assert route_for(view(*loop), A) is None
    assert MAX_MOVES >= 2


def test_live_peers_are_the_other_live_pods_with_an_address() -> None:
    snap = view(
        EpochRecord("9f2c1a7e-1", "live", 0, "10.0.0.1:8080"),  # this process
        EpochRecord("9f2c1a7e-2", "live", 3, "10.0.0.2:8080"),
        EpochRecord("9f2c1a7e-3", "draining", 0, "10.0.0.3:8080"),
        EpochRecord("9f2c1a7e-4", "live", None, "10.0.0.4:8080"),  # no process started yet
        EpochRecord("9f2c1a7e-5", "live", 0, None),
    )
    assert [str(p.epoch) for p in live_peers(snap, A)] == ["9f2c1a7e-2.3"]


def test_a_call_is_in_flight_until_a_chunk_follows_its_answer() -> None:
    async def main() -> None:
        inflight = InFlight()
        tag = object()
        inflight.started((tag, "1"))
        inflight.sent_after((tag, "1"))  # progress went out, no answer yet
        assert len(inflight) == 1
        inflight.answered((tag, "1"))
        done = anyio.Event()

        async def waiter() -> None:
            await inflight.wait_idle()
            done.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(waiter)
            await anyio.wait_all_tasks_blocked()  # the waiter is waiting, not done
            assert not done.is_set()
            inflight.sent_after((tag, "1"))  # the chunk carrying the answer
            await done.wait()
        assert len(inflight) == 0 and inflight.delivered == 1
        # A deleted session's calls, and cancelled ones, are not waited for.
        inflight.started((tag, "2"))
        inflight.started((tag, "3"))
        inflight.forget((tag, "2"))
        inflight.forget_session(tag)
        assert len(inflight) == 0 and inflight.delivered == 1

    anyio.run(main)


def test_a_relay_is_in_flight_until_it_ends_even_when_it_fails() -> None:
    async def main() -> None:
        inflight = InFlight()
        tag = object()
        inflight.started((tag, "1"))
        with pytest.raises(RuntimeError), inflight.relaying("peer-1.0"):
            inflight.answered((tag, "1"))
            inflight.sent_after((tag, "1"))  # this process's own call is delivered ...
            assert len(inflight) == 1 and inflight.relays == 1  # ... the relay is not
            assert inflight.pending() == [("relay to peer-1.0", False)]
            with anyio.move_on_after(0.05) as waited:
                await inflight.wait_idle()
            assert waited.cancelled_caught  # still busy while the relay runs
            raise RuntimeError("the owner went away mid-relay")
        assert len(inflight) == 0 and inflight.relays == 0
        await inflight.wait_idle()  # returns at once: nothing is in flight
        assert inflight.delivered == 1  # a relay is not a delivered call of this process

    anyio.run(main)


def test_the_app_sees_its_own_session_id_whatever_shape_the_headers_come_in() -> None:
    shown = f"{A}_0123456789abcdef".encode()
    tuples = [(b"host", b"h"), (SESSION_HEADER, shown), (b"accept", b"*/*")]
    rewritten = _with_session(tuples, shown, "0123456789abcdef")
    assert rewritten[1] == (SESSION_HEADER, b"0123456789abcdef")
    assert rewritten[::2] == [(b"host", b"h"), (b"accept", b"*/*")]
    assert tuples[1] == (SESSION_HEADER, shown)  # the server's own list is left as it was
    # A server that gives header fields as lists (allowed by ASGI) is matched by name.
    lists = [[b"host", b"h"], [SESSION_HEADER, shown]]
    assert _with_session(lists, shown, "abc") == [[b"host", b"h"], (SESSION_HEADER, b"abc")]
