"""Clients nobody here wrote, across a rolling deploy: sessions outlive their process.

The official TypeScript SDK client (1.32) and Go SDK client (1.8), installed from the npm
registry and the Go module proxy (:mod:`tests.clients.probes`), each hold one session and make
calls back to back while every replica of an mcp-epoch server is replaced, one at a time,
behind a balancer that sends every request to the next replica (round-robin per request: most
requests reach a process that does not hold their session). Neither client re-initializes on a
404 (the TypeScript client throws, the Go client fails its connection), so one refusal would
show. Every call must complete, on the same session, and none may wait on a client timeout.
"""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path
from typing import Any

import httpx
import pytest

from epochsvc.demo.balancer import Balancer
from epochsvc.demo.checker import Token
from epochsvc.demo.fleet import LocalProcessFleet
from epochsvc.demo.service import EpochService
from tests.clients.probes import go_probe, probe_calls

STEPS = 8  # 0.8 s per call, with a progress notification per step


async def _first_call(proc: asyncio.subprocess.Process) -> None:
    """Wait until the probe has ended its first call: its session exists, on the fleet as it
    is now."""
    assert proc.stdout is not None and proc.stderr is not None
    line = await asyncio.wait_for(proc.stdout.readline(), 120)
    if not line.strip() or json.loads(line) != {"called": 1}:
        err = await proc.stderr.read()
        raise AssertionError(f"a probe did not make its first call: {line!r} {err[-3000:]!r}")


async def _stop_probe(proc: asyncio.subprocess.Process) -> dict[str, Any]:
    """Close the probe's stdin: it makes one more call, begun now, and reports every call."""
    assert proc.stdin is not None
    proc.stdin.close()
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 0, f"the probe exited {proc.returncode}: {err.decode()[-3000:]}"
    result: dict[str, Any] = json.loads(out.decode().strip().splitlines()[-1])
    return result


async def _deploy_under(probes: list[str], workdir: Path) -> tuple[Any, ...]:
    """``probes``: the probes' names, each starting with its language (``ts-1``, ``go-2``)."""
    service = EpochService(workdir)
    service.start()
    lb = Balancer("request")
    await lb.start()
    fleet = LocalProcessFleet("epoch", lb, workdir, service=service)
    procs: list[asyncio.subprocess.Process] = []
    try:
        await fleet.start(3)
        first = {r.backend.name for r in fleet.replicas()}
        for name in probes:
            procs.append(
                await asyncio.create_subprocess_exec(
                    *probe_calls(name.split("-")[0], lb.url, STEPS),
                    stdin=asyncio.subprocess.PIPE,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.PIPE,
                )
            )
        await asyncio.gather(*(_first_call(p) for p in procs))
        # Every session was opened, and called, on the first fleet; the deploy replaces it.
        await fleet.rolling_deploy(1.0)
        # Each probe's last call begins now, with every old replica gone.
        stopped = await asyncio.gather(*(_stop_probe(p) for p in procs))
        results = dict(zip(probes, stopped, strict=True))
    finally:
        for p in procs:
            if p.returncode is None:
                p.kill()
                await p.wait()
        await fleet.close()
        await lb.stop()
        service.stop()
    return results, first, fleet.replicas()


@pytest.mark.timeout(300)
def test_sdk_clients_keep_their_sessions_through_a_rolling_deploy(tmp_path: Path) -> None:
    probes = ["ts-1", "ts-2", "go-1", "go-2"]
    results, first, replicas = asyncio.run(_deploy_under(probes, tmp_path))
    for name, result in results.items():
        calls = result["calls"]
        assert result["session"], name
        failed = [c for c in calls if not c["ok"]]
        assert not failed, (name, failed)
        # Each call streamed its progress and its own answer: nothing lost, nothing foreign.
        for c in calls:
            token = Token.parse(c["text"])
            assert token is not None and token.call == f"k{c['n']}" and token.n == STEPS, c
            assert c["progress"] == STEPS, (name, c)
        # No call waited on a client timeout (the TypeScript client's is 60 s).
        assert max(c["ms"] for c in calls) < 15_000, (name, calls)
        # The session outlived every process that held it: its last calls ran on new ones.
        served = [Token.parse(c["text"]).replica for c in calls]  # type: ignore[union-attr]
        assert served[-1] not in first, (name, served)
    replaced = [r for r in replicas if r.backend.name in first]
    # Every old replica drained and exited in time, keeping no session (each one it held went
    # on to a peer). Not every one need have held one: the balancer's rotation, shared with
    # every other request, can put none of the four initializes on a replica, and the sessions
    # of the first to drain may go to a new replica (CI saw a replica hand on none, every call
    # of every session completing).
    assert all(not r.killed and r.drain.get("kept", 1) == 0 for r in replaced), [
        (r.backend.name, r.drain) for r in replaced
    ]
    assert sum(r.drain.get("handed", 0) for r in replaced) > 0, [r.drain for r in replaced]


async def _refused_beside(probe: list[str], workdir: Path) -> dict[str, Any]:
    service = EpochService(workdir)
    service.start()
    lb = Balancer("link")
    fleet = LocalProcessFleet(
        "epoch", lb, workdir, service=service, env={"MCP_EPOCH_HANDOFF": "off"}
    )
    try:
        await fleet.start(2)
        owner = fleet.replicas()[0]
        url = f"http://{owner.backend.host}:{owner.backend.port}"
        proc = await asyncio.create_subprocess_exec(
            *probe,
            "-url",
            f"{url}/mcp",
            "-overlap",
            "-steps",
            "20",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        assert proc.stdin is not None and proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), 30)
        assert json.loads(line) == {"in_flight": 1}, line
        assert owner.proc is not None
        owner.proc.send_signal(signal.SIGTERM)  # the owner drains with the first call running
        async with httpx.AsyncClient(timeout=2.0) as http:
            for _ in range(500):  # polling a condition the process reaches by itself
                if (await http.get(f"{url}/readyz")).status_code != 200:
                    break
                await asyncio.sleep(0.02)
            else:
                raise AssertionError("the owner never began to drain")
        proc.stdin.write(b"next\n")  # now the second call: refused before it runs
        await proc.stdin.drain()
        out, err = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode == 0, err.decode()[-3000:]
        result: dict[str, Any] = json.loads(out.decode().strip().splitlines()[-1])
        return result
    finally:
        await fleet.close()
        service.stop()


@pytest.mark.timeout(120)
def test_a_refused_call_does_not_take_the_go_clients_call_in_flight_down(tmp_path: Path) -> None:
    """Where a session cannot move (handoff off here), a draining owner refuses a new call
    before it runs. Its error echoes the request's id: the Go SDK client cannot decode an
    error with a null id and took the 404 for a lost session ("session not found"), failing
    the connection. The refusal must reach it as that one call's error, and the call still
    running on the owner must complete."""
    first, second = asyncio.run(_refused_beside(go_probe(), tmp_path))["calls"]
    assert (not second["ok"] and "404" in second["error"]) or "retired" in second["error"], second
    assert first["ok"] and first["progress"] == 20, first
    token = Token.parse(first["text"])
    assert token is not None and token.call == "k1" and token.n == 20
