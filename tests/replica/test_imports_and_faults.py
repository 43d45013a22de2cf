"""Import hygiene, and the guard's handling of faults we cannot make the real SDK produce."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import anyio
import httpx

from mcp_epoch._internal.guard import ResumptionGuard
from mcp_epoch._internal.sessions import SessionTag, current_session
from mcp_epoch._internal.store import EpochEventStore
from mcp_epoch.contract import PodEpoch, ProcessEpoch


def test_library_imports_without_mcp_fastapi_uvicorn_sqlalchemy_kopf() -> None:
    code = textwrap.dedent("""
        import sys
        for name in ("mcp", "mcp_types", "fastapi", "uvicorn", "sqlalchemy", "kopf", "starlette",
                     "epochsvc", "mcp_epoch_operator"):
            sys.modules[name] = None  # any import of these now fails
        import mcp_epoch
        from mcp_epoch._internal import guard, decision, liveview, process, buffer, eventid
        buf = buffer.ReplayBuffer(4)
        buf.append("A", "1", "m")
        assert eventid.EventId.decode("9f2c1a7e-42.0:1").seq == 1
        assert issubclass(mcp_epoch.ResumptionRejected, Exception)
        for lazy in ("epoch_safe_app", "EpochClient"):
            try:
                getattr(mcp_epoch, lazy)
            except ImportError:
                print("lazy", lazy)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split("\n")[:2] == ["lazy epoch_safe_app", "lazy EpochClient"]


def test_the_public_face_is_small() -> None:
    import mcp_epoch

    assert mcp_epoch.__all__ == [
        "EpochClient",
        "EpochSafeApp",
        "Reason",
        "ResumptionRejected",
        "epoch_safe_app",
        "request_state_security",
        "serve",
        "sidecar_app",
    ]
    for name in mcp_epoch.__all__:
        assert getattr(mcp_epoch, name) is not None


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
