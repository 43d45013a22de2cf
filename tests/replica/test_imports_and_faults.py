"""Import hygiene, and the guard's handling of faults we cannot make the real SDK produce."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import anyio
import httpx

from epochsvc.replica import EpochEventStore, ResumptionGuard, SessionTag, current_session
from epochsvc.tokens import PodEpoch, ProcessEpoch


def test_replica_imports_without_mcp_fastapi_uvicorn_sqlalchemy_kopf() -> None:
    code = textwrap.dedent("""
        import sys
        for name in ("mcp", "fastapi", "uvicorn", "sqlalchemy", "kopf", "starlette"):
            sys.modules[name] = None  # any import of these now fails
        import epochsvc.replica as r
        from epochsvc.replica import guard, decision, liveview, process
        buf = r.ReplayBuffer(4)
        buf.append("A", "1", "m")
        assert r.EventId.decode("9f2c1a7e-42.0:1").seq == 1
        try:
            r.EpochEventStore
        except ImportError:
            print("lazy ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "lazy ok" in out.stdout


def test_a_failing_replay_never_reaches_the_client_as_500() -> None:
    # Fault injection: a stand-in for the SDK app that answers 500 after the guard accepted
    # (the real SDK does this when the store raises outside the stream). Not reproducible with
    # the real SDK on demand, hence the fake app.
    store = EpochEventStore(ProcessEpoch(PodEpoch("9f2c1a7e", 42), 0), capacity=10)

    async def failing_sdk(scope: object, receive: object, send: object) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": 500,  # type: ignore[operator]
                "headers": [(b"content-type", b"application/json")],
            }
        )
        await send({"type": "http.response.body", "body": b'{"boom": 1}'})  # type: ignore[operator]

    guard = ResumptionGuard(failing_sdk, store)
    tag = SessionTag()
    guard.sessions.bind("s1", tag)

    async def main() -> httpx.Response:
        token = current_session.set(tag)
        try:
            eid = await store.store_event("1", None)
        finally:
            current_session.reset(token)
        transport = httpx.ASGITransport(app=guard)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            return await c.get(
                "/mcp",
                headers={
                    "last-event-id": eid,
                    "mcp-session-id": "s1",
                    "mcp-protocol-version": "2025-11-25",
                },
            )

    r = anyio.run(main)
    assert r.status_code == 404
    assert r.headers["mcp-resumption-rejected"] == "unknown"
    assert r.json()["error"]["data"]["reason"] == "unknown"
