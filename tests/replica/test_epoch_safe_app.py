"""``epoch_safe_app(mcp)``: one line, nothing on the network until the lifespan starts it."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import httpx
import pytest
from mcp.server.mcpserver import MCPServer

import mcp_epoch
from tests.support.epochsvc_proc import EpochServiceProcess

pytestmark = pytest.mark.anyio


def server() -> MCPServer:
    mcp = MCPServer("one-line")

    @mcp.tool()
    async def hello() -> str:
        return "hi"

    return mcp


async def start_and_stop(app: Any) -> list[str]:
    """One ASGI lifespan through ``app`` (startup, then shutdown); what it answered."""
    events: list[dict[str, Any]] = [{"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}]
    sent: list[str] = []

    async def receive() -> dict[str, Any]:
        return events.pop(0)

    async def send(msg: dict[str, Any]) -> None:
        sent.append(msg["type"])

    await app({"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}}, receive, send)
    return sent


async def test_construction_touches_no_network_and_starts_no_thread() -> None:
    threads = threading.active_count()
    env = {"MCP_EPOCH": "9f2c1a7e-1", "MCP_EPOCH_SERVICE_URL": "http://192.0.2.1:9"}
    env |= {"MCP_SERVER_NAMESPACE": "ns", "MCP_SERVER_NAME": "srv"}
    t0 = time.monotonic()
    app = mcp_epoch.epoch_safe_app(server(), env=env)
    assert time.monotonic() - t0 < 0.5  # a blocked connect would take seconds
    assert threading.active_count() == threads
    assert app.process_start is None and app.view is not None


async def test_a_request_before_the_lifespan_gets_a_clear_503() -> None:
    app = mcp_epoch.epoch_safe_app(server(), env={})
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:
        r = await c.post("/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "ping"})
    assert r.status_code == 503
    assert "lifespan" in r.json()["error"]["message"]


async def test_the_lifespan_registers_the_process_and_follows_the_ledger(
    epoch_service: EpochServiceProcess,
) -> None:
    pod = epoch_service.live("ns", "srv", "p1")
    env = epoch_service.replica_env(pod, "ns", "srv")
    env["MCP_POD_UID"] = "uid-p1"
    app = mcp_epoch.epoch_safe_app(server(), env=env)
    answered = await start_and_stop(app)
    assert answered == ["lifespan.startup.complete", "lifespan.shutdown.complete"]
    assert app.process_start is not None and app.process_start.registered
    assert str(app.epoch) == f"{pod}.0"
    # The view saw this very epoch before serving, and its thread is gone after shutdown.
    assert app.view is not None and pod in app.view.snapshot.epochs
    assert "epoch-live-view" not in {t.name for t in threading.enumerate()}


async def test_running_is_for_hosts_whose_lifespan_does_not_reach_the_app() -> None:
    app = mcp_epoch.epoch_safe_app(server(), env={})
    async with app.running():
        # No MCP_EPOCH: a fallback epoch that no ledger issues, never mistaken for another.
        assert app.process_start is not None and not app.process_start.registered
        first = app.epoch
        await app.start()  # a lifespan that does reach it later changes nothing
        assert app.epoch == first


async def test_httpx_request_lines_are_quiet_unless_the_application_asked_for_them() -> None:
    httpx_log, root = logging.getLogger("httpx"), logging.getLogger()
    saved = httpx_log.level, root.level
    try:
        httpx_log.setLevel(logging.NOTSET)
        root.setLevel(logging.INFO)  # what the SDK's MCPServer does
        mcp_epoch.epoch_safe_app(server(), env={})
        # The forwarder's and the live view's requests no longer log a line each at INFO.
        assert not httpx_log.isEnabledFor(logging.INFO)
        assert httpx_log.isEnabledFor(logging.WARNING)

        httpx_log.setLevel(logging.DEBUG)  # an application that wants them keeps them
        mcp_epoch.epoch_safe_app(server(), env={})
        assert httpx_log.isEnabledFor(logging.INFO)
    finally:
        httpx_log.setLevel(saved[0])
        root.setLevel(saved[1])
