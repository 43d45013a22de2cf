"""What the demo's clients record about the HTTP answers their calls get, and what they do
when a call hangs.

Every call that fails must be explained by what the client was told; most tests here feed real
``httpx2`` responses (no server needed: the client only reads them) to the client's hook. The
last runs the client against a real sidecar fleet.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import httpx2
import mcp_types as types
import pytest

from epochsvc.demo.balancer import Balancer
from epochsvc.demo.client import CallShape, EpochDemoClient
from epochsvc.demo.fleet import LocalProcessFleet
from epochsvc.demo.service import EpochService
from mcp_epoch.contract import FORWARDED_BY_HEADER, REJECTED_HEADER

URL = "http://127.0.0.1:1/mcp"
SESSION = {"mcp-session-id": "s-1"}


def _response(status: int, method: str, body: object = None, **headers: str) -> httpx2.Response:
    content = b"" if body is None else json.dumps(body).encode()
    request = httpx2.Request(method, URL, content=content, headers={**SESSION, **headers})
    return httpx2.Response(status, request=request)


def _client() -> EpochDemoClient:
    return EpochDemoClient(0, URL, CallShape(), asyncio.Event())


def test_a_refused_answer_to_the_calls_question_explains_the_rejected_call() -> None:
    """The session was lost under the call (its owner killed): the 404 came on the POST of
    the answer to the server's question, not on the call's own POST or a resumption."""
    client = _client()
    call, _ = client._new_call(1)
    answer = {"jsonrpc": "2.0", "id": 0, "result": {"action": "accept"}}
    client._observe(_response(404, "POST", answer), 1, rejected=True)
    call.finish("rejected")
    assert call.session_refused == "POST"
    assert not call.refused and not call.reconnects


def test_a_refusal_of_an_older_session_is_not_the_calls() -> None:
    client = _client()
    call, _ = client._new_call(2)
    client._observe(_response(404, "POST", {"jsonrpc": "2.0", "id": 1, "result": {}}), 1, True)
    assert call.session_refused == ""


def test_a_call_follows_the_session_opened_under_it() -> None:
    """A call that starts as its session's connection is lost runs on the next one: a
    resumption refused there is recorded on the call."""
    client = _client()
    call, _ = client._new_call(1)
    client._observe(_response(404, "GET", **{"last-event-id": "e-1"}), 2, rejected=True)
    assert [rc.status for rc in call.reconnects] == [404]


def test_a_refused_call_post_is_a_refusal_not_a_lost_session() -> None:
    client = _client()
    call, _ = client._new_call(1)
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "work"}}
    client._observe(_response(404, "POST", body, **{REJECTED_HEADER: "unknown"}), 1, True)
    assert call.refused and call.session_refused == ""


def _answered(status: int, method: str, **headers: str) -> httpx2.Response:
    """A response carrying ``headers`` (to a resumption GET, or a POST)."""
    request = httpx2.Request(method, URL, headers={**SESSION, "last-event-id": "e-1"})
    return httpx2.Response(status, request=request, headers=headers)


def test_rejections_forwards_and_the_calls_start_are_stamped_for_the_timeline() -> None:
    before = time.monotonic()
    client = _client()
    call, _ = client._new_call(1)
    client._observe(_answered(200, "GET", **{FORWARDED_BY_HEADER: "9f2c1a7e-1.0"}), 1, False)
    client._observe(_answered(200, "GET"), 1, False)  # served by the owner itself
    client._observe(_answered(404, "GET", **{REJECTED_HEADER: "unknown"}), 1, True)
    # Stamped for an older session too: the timeline counts every response the client saw.
    client._observe(_answered(404, "POST", **{REJECTED_HEADER: "gap"}), 0, True)
    after = time.monotonic()
    result = client.result
    assert result.reasons == {"unknown": 1, "gap": 1}
    assert len(result.rejected_at) == 2 and len(result.forwarded_at) == 1
    stamps = [call.started_at, *result.forwarded_at, *result.rejected_at]
    assert all(t is not None and before <= t <= after for t in stamps)
    assert result.forwarded_at[0] <= result.rejected_at[0] <= result.rejected_at[1]
    assert call.ended_at is None  # the call's wait has not ended


def test_the_end_of_a_calls_wait_is_stamped_however_it_ends() -> None:
    """The deadline ends it here (a hung call); an answer or an error ends it the same way."""
    client = EpochDemoClient(0, URL, CallShape(steps=1, interval=0.0, slack=0.05), asyncio.Event())
    call, _ = client._new_call(1)

    async def never() -> types.CallToolResult:
        await asyncio.Event().wait()
        raise AssertionError("the event is never set")

    async def run() -> None:
        with pytest.raises(TimeoutError):
            await client._answer(call, never())

    asyncio.run(run())
    assert call.started_at is not None and call.ended_at is not None
    assert call.ended_at - call.started_at >= 0.05


@pytest.mark.timeout(120)
def test_a_hung_call_ends_its_client_so_its_tools_late_question_reaches_no_later_call(
    tmp_path: Path,
) -> None:
    """A TypeScript SDK server behind the sidecar, whose tool, as the SDK's README writes one,
    does not watch its abort signal: it goes on asking after its client gave up. The SDK client
    keeps reading a cancelled call's stream, so had the user carried on with the same client,
    the hung call's next question would reach the next call (a busy-core demo counted one such
    question as a foreign event). Every call here hangs: its deadline comes before its first
    question. After each, the user opens a new client, and no call accepts a question of
    another."""
    # 20 steps of 0.1 s with a question every 5: questions at 0.5 s, 1 s, ...; deadline 0.3 s.
    shape = CallShape(steps=20, interval=0.1, ask_every=5, slack=-1.7)

    async def run() -> EpochDemoClient:
        service = EpochService(tmp_path)
        service.start()
        lb = Balancer("link")
        await lb.start()
        fleet = LocalProcessFleet("sidecar", lb, tmp_path, service=service)
        try:
            await fleet.start(1)
            stop = asyncio.Event()
            client = EpochDemoClient(0, lb.url, shape, stop)
            task = asyncio.create_task(client.run())
            # Polling a condition the client reaches by itself: its fifth call has ended.
            while sum(c.outcome != "pending" for c in client.result.calls) < 5:
                assert not task.done(), task
                await asyncio.sleep(0.05)
            stop.set()
            await asyncio.wait_for(task, 60)
            return client
        finally:
            await fleet.close()
            await lb.stop()
            service.stop()

    client = asyncio.run(run())
    calls = client.result.calls
    assert len(calls) >= 5 and all(c.outcome == "hung" for c in calls), calls
    assert [c.crossed for c in calls if c.foreign] == []
    # A new client, and so a new session, after every hung call.
    assert len({c.uid for c in calls}) == len(calls), [c.uid for c in calls]
