"""Against a real epoch service process (temp SQLite ledger) on loopback."""

from __future__ import annotations

import time
from typing import Any

import httpx

from mcp_epoch import api
from mcp_epoch._internal.config import ReplicaConfig
from mcp_epoch._internal.liveview import LiveEpochView
from mcp_epoch._internal.process import start_process_epoch
from mcp_epoch.contract import FALLBACK_INCARNATION_MIN
from tests.replica.conftest import RawSession
from tests.support.epochsvc_proc import EpochServiceProcess as EpochService
from tests.support.ports import free_port


def _state(view: LiveEpochView, epoch: str) -> str | None:
    rec = view.snapshot.epochs.get(epoch)
    return None if rec is None else rec.state


def test_live_view_follows_changes_and_survives_service_restart(
    epoch_service: EpochService,
) -> None:
    svc = epoch_service
    view = LiveEpochView(svc.url, "ns", "srv", svc.replica_token, wait=5.0, max_backoff=0.3)
    view.start()
    try:
        e1 = svc.live("ns", "srv", "a")
        assert view.wait_for(lambda s: _state_of(s, e1) == "live", 10)
        ledger = view.snapshot.ledger_id
        svc.stop()
        # The service is away: the copy keeps answering, without I/O.
        t0 = time.monotonic()
        assert view.snapshot.epochs[e1].state == "live"
        assert time.monotonic() - t0 < 0.01
        deadline = time.monotonic() + 10
        while view.last_error is None:  # the copy notices the service has gone
            assert time.monotonic() < deadline, "the copy never noticed the service was down"
            time.sleep(0.05)
        assert view.snapshot.epochs[e1].state == "live"
        svc.start()  # same ledger file, same port
        svc.send(api.drain(e1))
        assert view.wait_for(lambda s: _state_of(s, e1) == "draining", 15)
        e2 = svc.live("ns", "srv", "b")
        assert view.wait_for(lambda s: _state_of(s, e2) == "live", 10)
        assert view.snapshot.ledger_id == ledger
        # Another server's epochs never show up in this server's copy.
        other = svc.live("ns", "other", "c")
        # Changes reach the copy in ledger order: once a later one of this server's is there,
        # the other server's would have been too.
        e3 = svc.live("ns", "srv", "d")
        assert view.wait_for(lambda s: _state_of(s, e3) == "live", 10)
        assert other not in view.snapshot.epochs
    finally:
        view.stop()


def _state_of(snap: Any, epoch: str) -> str | None:
    rec = snap.epochs.get(epoch)
    return None if rec is None else str(rec.state)


def test_process_start_registers_incarnations_and_falls_back(
    epoch_service: EpochService,
) -> None:
    svc = epoch_service
    e = svc.live("ns", "srv", "a")
    cfg = ReplicaConfig.from_env(svc.replica_env(e, "ns", "srv"))
    first = start_process_epoch(cfg)
    second = start_process_epoch(cfg)
    assert first.registered and second.registered
    assert str(first.epoch) == f"{e}.0" and str(second.epoch) == f"{e}.1"
    # Service unreachable: a random incarnation the ledger never issues, same pod epoch.
    dead = ReplicaConfig.from_env(
        {
            **svc.replica_env(e, "ns", "srv"),
            "MCP_EPOCH_SERVICE_URL": f"http://127.0.0.1:{free_port()}",
        }
    )
    fb = start_process_epoch(dead, attempts=1, timeout=0.5)
    assert not fb.registered and str(fb.epoch.pod) == e
    assert fb.epoch.incarnation >= FALLBACK_INCARNATION_MIN
    # Retired pod epoch: the service refuses (409), the process falls back.
    svc.send(api.retire(e))
    refused = start_process_epoch(cfg)
    assert not refused.registered and "409" in refused.detail


def _reject_reason(s: RawSession, cursor: str, want: str, timeout: float = 10.0) -> str:
    deadline = time.monotonic() + timeout
    reason = ""
    while time.monotonic() < deadline:
        r, events = s.resume(cursor)
        assert r.status_code == 404 and events == []
        reason = r.headers["mcp-resumption-rejected"]
        assert r.json()["error"]["data"]["reason"] == reason
        if reason == want:
            return reason
        time.sleep(0.1)
    return reason


def test_foreign_cursor_reasons_follow_the_ledger_and_zombies_refuse(
    epoch_service: EpochService, server_factory: Any, http: httpx.Client
) -> None:
    svc = epoch_service
    ea, eb = svc.live("ns", "srv", "a"), svc.live("ns", "srv", "b")
    a = server_factory(svc.replica_env(ea, "ns", "srv"))
    b = server_factory(svc.replica_env(eb, "ns", "srv"))
    assert a.epoch == f"{ea}.0" and b.epoch == f"{eb}.0"
    sa = RawSession(a.url, http).initialize()
    first = sa.countdown(3, close_after=1)
    cursor = [e.id for e in first if e.id][-1]
    sb = RawSession(b.url, http).initialize()
    assert _reject_reason(sb, cursor, "live-elsewhere") == "live-elsewhere"
    svc.send(api.drain(ea))
    assert _reject_reason(sb, cursor, "draining") == "draining"
    svc.send(api.retire(ea))
    assert _reject_reason(sb, cursor, "retired") == "retired"
    # A is now a zombie: its own cursors and new sessions are refused with "retired".
    assert _reject_reason(sa, cursor, "retired") == "retired"
    r, _ = RawSession(a.url, http).post(
        "initialize",
        {
            "protocolVersion": "2025-11-25",
            "capabilities": {},
            "clientInfo": {"name": "late", "version": "0"},
        },
    )
    assert r.status_code == 404 and r.headers["mcp-resumption-rejected"] == "retired"
    # Never-issued epochs of this ledger are "unknown".
    assert _reject_reason(sb, f"{eb.split('-')[0]}-999.0:1", "unknown") == "unknown"


def test_refused_credentials_are_loud_and_remembered(
    epoch_service: EpochService, caplog: Any
) -> None:
    svc = epoch_service
    view = LiveEpochView(svc.url, "ns", "srv", "not-the-token", wait=1.0, max_backoff=0.2)
    with caplog.at_level("ERROR", logger="mcp_epoch._internal.liveview"):
        view.start()
        try:
            assert view.wait_for(lambda _: view.refused, 10)
        finally:
            view.stop()
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert errors and "MCP_EPOCH_SERVICE_TOKEN" in errors[0]
    assert view.snapshot.ledger_id is None  # nothing was taken from a refused answer
