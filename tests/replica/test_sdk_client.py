"""The real SDK client over HTTP against real example-server processes."""

from __future__ import annotations

import time
from typing import Any

import anyio
import httpx
import pytest
from mcp import Client

from mcp_epoch import EpochClient, ResumptionRejected
from tests.replica.conftest import ServerProc

pytestmark = pytest.mark.anyio


def _set_on_progress(event: anyio.Event) -> Any:
    """A progress callback that says the call has started running on its server."""

    async def on_progress(p: float, total: float | None, msg: str | None) -> None:
        event.set()

    return on_progress


async def test_sdk_client_resumes_transparently_on_same_process(server: ServerProc) -> None:
    progress: list[float] = []

    async def on_progress(p: float, total: float | None, msg: str | None) -> None:
        progress.append(p)

    async with Client(server.url, mode="legacy") as client:
        result = await client.call_tool(
            "countdown", {"n": 12, "delay": 0.02, "close_after": 4}, progress_callback=on_progress
        )
    assert result.content[0].text == "done 12"  # type: ignore[union-attr]
    assert progress == list(range(1, 13))


async def test_2026_client_through_the_guard_is_untouched(server: ServerProc) -> None:
    async with Client(server.url, mode="2026-07-28") as client:
        result = await client.call_tool("countdown", {"n": 3, "delay": 0.0})
    assert result.content[0].text == "done 3"  # type: ignore[union-attr]


async def test_helper_fails_pending_call_fast_and_continues_on_fresh_session(
    server_factory: Any,
) -> None:
    first = server_factory()
    port = first.port
    async with EpochClient(first.url, min_backoff=0.05) as client:
        sid_before = client.session_id
        failed_at: list[float] = []
        running = anyio.Event()

        async def long_call() -> None:
            try:
                await client.call_tool(
                    "countdown",
                    {"n": 200, "delay": 0.05, "close_after": 3},
                    progress_callback=_set_on_progress(running),
                )
            except ResumptionRejected as exc:
                failed_at.append(time.monotonic())
                assert exc.reason == "unknown"
            else:
                raise AssertionError("the pending call should have been rejected")

        async with anyio.create_task_group() as tg:
            tg.start_soon(long_call)
            # Only once the call runs: a call refused before it ran is retried, not failed.
            with anyio.fail_after(30):
                await running.wait()
            # The process that owes the answer dies; another process takes its address.
            first.stop()
            second = server_factory(port=port)
            assert second.epoch != first.epoch
        # The SDK reconnected with Last-Event-ID, the new process's guard rejected it (another
        # epoch), and the helper failed the pending call instead of letting it wait.
        assert client.rejections and client.rejections[0].reason == "unknown" and failed_at
        result = await client.call_tool("countdown", {"n": 2, "delay": 0.0})
        assert result.content[0].text == "done 2"  # type: ignore[union-attr]
        assert client.session_number == 2
        assert client.session_id not in (None, sid_before)


async def test_helper_fails_pending_call_within_a_second(server_factory: Any) -> None:
    first = server_factory()
    async with EpochClient(first.url, min_backoff=0.05) as client:
        rejected_seen: list[float] = []
        orig = client._on_response

        async def spy(att: Any, response: Any) -> None:
            await orig(att, response)
            if att.rejected is not None and not rejected_seen:
                rejected_seen.append(att.rejected_at)

        client._on_response = spy  # type: ignore[method-assign]
        done: list[float] = []
        running = anyio.Event()

        async def long_call() -> None:
            with pytest.raises(ResumptionRejected):
                await client.call_tool(
                    "countdown",
                    {"n": 200, "delay": 0.05, "close_after": 2},
                    progress_callback=_set_on_progress(running),
                )
            done.append(time.monotonic())

        async with anyio.create_task_group() as tg:
            tg.start_soon(long_call)
            # Only once the call runs: a call refused before it ran (its POST met the deleted
            # session) is safely retried on a fresh session, not failed.
            with anyio.fail_after(30):
                await running.wait()
            # Make the server forget the session: DELETE it behind the client's back.
            sid = client.session_id
            assert sid is not None
            async with httpx.AsyncClient() as h:
                await h.delete(
                    first.url, headers={"mcp-session-id": sid, "mcp-protocol-version": "2025-11-25"}
                )
        assert rejected_seen and done
        assert done[0] - rejected_seen[0] < 1.0
        result = await client.call_tool("countdown", {"n": 1, "delay": 0.0})
        assert result.content[0].text == "done 1"  # type: ignore[union-attr]


async def test_epoch_client_delivers_every_progress_step_across_reconnects(
    server: ServerProc,
) -> None:
    # EpochClient gives each call a progress token of its own (an explicit resumption is a new
    # request id, and the SDK would drop progress carrying the old one).
    progress: list[float] = []
    seen: list[Any] = []

    async def on_progress(p: float, total: float | None, msg: str | None) -> None:
        progress.append(p)

    async def on_message(message: Any) -> None:
        seen.append(message)

    async with EpochClient(server.url, message_handler=on_message) as client:
        result = await client.call_tool(
            "countdown", {"n": 12, "delay": 0.02, "close_after": 4}, progress_callback=on_progress
        )
    assert result.content[0].text == "done 12"  # type: ignore[union-attr]
    assert progress == list(range(1, 13))
    assert len(seen) == 12  # the caller's own handler still sees every notification
