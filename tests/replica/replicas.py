"""Replicas of one server as real processes sharing a real epoch service, bound in the ledger
with their loopback addresses as the operator binds pods with their IPs."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from mcp_epoch import api
from mcp_epoch.contract import FORWARDED_BY_HEADER
from tests.replica.conftest import RawSession, ServerProc, start_server
from tests.support.epochsvc_proc import EpochServiceProcess

NS, SERVER = "ns", "fwd"


@dataclass
class Replica:
    srv: ServerProc
    pod_epoch: str

    @property
    def url(self) -> str:
        return self.srv.url


def launch(svc: EpochServiceProcess, name: str, log: Path | None = None, **env: str) -> Replica:
    """Issue, bind, start, then bind again with the address: the order a pod goes through."""
    pod_epoch = svc.issue(NS, SERVER, f"req-{name}")
    svc.send(api.bind(pod_epoch, name, f"uid-{name}"))
    env = {**svc.replica_env(pod_epoch, NS, SERVER), "MCP_POD_NAME": name, **env}
    srv = start_server(env, log=log)
    svc.send(api.bind(pod_epoch, name, f"uid-{name}", f"127.0.0.1:{srv.port}"))
    return Replica(srv, pod_epoch)


def forwarded_ping(via: Replica, session: RawSession, http: httpx.Client) -> bool:
    r = http.post(
        via.url,
        json={"jsonrpc": "2.0", "id": 999, "method": "ping"},
        headers=session.headers(),
    )
    return r.status_code == 200 and FORWARDED_BY_HEADER in r.headers


def slow_countdown(steps: int, token: str, rid: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """(params, JSON-RPC body) of a countdown call 0.1 s per step, with progress."""
    params = {
        "name": "countdown",
        "arguments": {"n": steps, "delay": 0.1},
        "_meta": {"progressToken": token},
    }
    return params, {"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": params}


def until(condition: object, within: float = 15.0) -> None:
    """Wait for a condition the servers reach on their own (a ledger copy catching up)."""
    deadline = time.monotonic() + within
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.05)


@contextlib.contextmanager
def replicas(
    svc: EpochServiceProcess,
    http: httpx.Client,
    tmp_path: Path,
    names: tuple[str, ...],
    **env: str,
) -> Iterator[list[Replica]]:
    """Start one replica per name (its log in ``tmp_path/<name>.log``); yield them once every
    one's copy of the ledger knows every other's address (a forwarded ping gets through)."""
    started: list[Replica] = []
    try:
        for name in names:
            started.append(launch(svc, name, log=tmp_path / f"{name}.log", **env))
        probes = [RawSession(r.url, http).initialize() for r in started]
        for via in started:
            for owner, probe in zip(started, probes, strict=True):
                if owner is not via:
                    until(lambda via=via, probe=probe: forwarded_ping(via, probe, http))
        yield started
    finally:
        for r in started:
            r.srv.stop()
