"""The one epoch-service client (:mod:`mcp_epoch.api_client`) against a real service process:
typed answers, the service's refusals as codes, outages as outages, retries within a deadline."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from mcp_epoch import api
from mcp_epoch.api_client import (
    EpochServiceClient,
    EpochServiceError,
    EpochServiceUnavailable,
    RetryPolicy,
    SyncEpochServiceClient,
)
from tests.support.epochsvc_proc import EpochServiceProcess
from tests.support.ports import free_port

pytestmark = pytest.mark.anyio


async def test_issue_is_idempotent_and_lifecycle_calls_work(
    epoch_service: EpochServiceProcess,
) -> None:
    async with EpochServiceClient(epoch_service.url, epoch_service.operator_token) as client:
        first = await client.send(api.issue("ns", "echo", "req-1"))
        again = await client.send(api.issue("ns", "echo", "req-1"))
        assert isinstance(first, api.Epoch)
        assert first.epoch == again.epoch and first.state == "pending"
        other = await client.send(api.issue("ns", "echo", "req-2"))
        assert other.generation > first.generation
        bound = await client.send(api.lifecycle("bind", first.epoch, "p", "uid-1", "10.0.0.1:80"))
        assert bound.state == "live" and bound.address == "10.0.0.1:80"
        assert (await client.send(api.drain(first.epoch))).state == "draining"
        assert (await client.send(api.retire(first.epoch))).state == "retired"
        listing = await client.send(api.list_server("ns", "echo"))
        assert {e.epoch: e.state for e in listing.epochs} == {
            first.epoch: "retired",
            other.epoch: "pending",
        }
        with pytest.raises(EpochServiceError) as info:
            await client.send(api.retire(other.epoch))  # pending epochs cannot be retired
        assert info.value.status == 409 and info.value.code == "illegal-transition"
        with pytest.raises(EpochServiceError) as info:
            await client.send(api.bind(first.epoch, "q", "uid-other"))
        assert info.value.code == "pod-mismatch"
        assert (await client.send(api.ready())).ledger_id == listing.ledger_id


def test_the_sync_client_makes_the_replicas_calls(epoch_service: EpochServiceProcess) -> None:
    """Issue and bind as the operator, then register a process start and read it back as the
    pod's replica token does."""
    with SyncEpochServiceClient(epoch_service.url, epoch_service.operator_token) as operator:
        pod = operator.send(api.issue("ns", "echo", "req-s"))
        operator.send(api.bind(pod.epoch, "p", "uid-s"))
    with SyncEpochServiceClient(epoch_service.url, lambda: epoch_service.replica_token) as replica:
        started = replica.send(api.register_incarnation(pod.epoch, "p", "uid-s"))
        assert started.epoch.epoch == pod.epoch and started.process_epoch.startswith(pod.epoch)
        seen = replica.send(api.get_epoch(started.process_epoch))
        assert seen.requested == started.process_epoch and seen.process_state == "live"
        # A long poll at the current revision answers when the wait is over, unchanged.
        now = replica.send(api.list_server("ns", "echo"))
        polled = replica.send(api.list_server("ns", "echo", since=now.revision, wait=0.2))
        assert polled.revision == now.revision


def test_arguments_the_service_would_refuse_are_refused_before_sending() -> None:
    with pytest.raises(ValueError):
        api.issue("Not_A_Name", "echo", "req-1")
    with pytest.raises(ValueError):
        api.bind("abcd1234-1", "p", "uid", address="no-port")
    with pytest.raises(ValueError, match="verb"):
        api.lifecycle("explode", "abcd1234-1", "p", "uid")


async def test_wrong_token_is_an_error_not_an_outage(epoch_service: EpochServiceProcess) -> None:
    async with EpochServiceClient(epoch_service.url, "not-the-token") as client:
        with pytest.raises(EpochServiceError) as info:
            await client.send(api.issue("ns", "echo", "req-1"))
    assert info.value.status == 403


async def test_unreachable_service_fails_within_the_deadline() -> None:
    policy = RetryPolicy(deadline=1.0, attempt_timeout=0.5, first_backoff=0.05)
    began = time.monotonic()
    async with EpochServiceClient(f"http://127.0.0.1:{free_port()}", "t") as client:
        with pytest.raises(EpochServiceUnavailable, match="Connect"):
            await client.send(api.issue("ns", "echo", "req-1"), policy)
    assert time.monotonic() - began < 2.0


async def test_a_silent_service_is_named_as_silent() -> None:
    # A listening socket nobody accepts from: connects succeed, answers never come.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        port = silent.getsockname()[1]
        policy = RetryPolicy(deadline=1.0, attempt_timeout=0.4, first_backoff=0.05)
        async with EpochServiceClient(f"http://127.0.0.1:{port}", "t") as client:
            with pytest.raises(
                EpochServiceUnavailable, match=r"no answer within 0.4s \(\d+ attempts"
            ):
                await client.send(api.issue("ns", "echo", "req-1"), policy)


async def test_a_restarted_service_is_reached_by_retries(
    epoch_service: EpochServiceProcess,
) -> None:
    epoch_service.stop()
    async with EpochServiceClient(epoch_service.url, epoch_service.operator_token) as client:
        restart = asyncio.get_running_loop().run_in_executor(None, epoch_service.start)
        issued = await client.send(api.issue("ns", "echo", "req-r"), RetryPolicy(deadline=30.0))
        await restart
    assert issued.state == "pending"


@contextmanager
def _peer(status: int, body: bytes) -> Iterator[str]:
    """A loopback HTTP server that is not the epoch service (a proxy's error page, a wrong
    URL): it answers every request with ``status`` and ``body``; yields its URL."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize(
    ("status", "body", "code"),
    [
        (404, b"<html>not found</html>", "error"),
        (200, b'{"epoch": 5}', "bad-answer"),
        (200, b"not json", "bad-answer"),
    ],
)
def test_an_answer_not_in_the_apis_shape_is_an_error_with_its_status(
    status: int, body: bytes, code: str
) -> None:
    with (
        _peer(status, body) as url,
        SyncEpochServiceClient(url, "t") as client,
        pytest.raises(EpochServiceError) as info,
    ):
        client.send(api.get_epoch("abcd1234-1"))
    assert (info.value.status, info.value.code) == (status, code)


def test_a_gateway_error_is_an_outage() -> None:
    with (
        _peer(502, b"bad gateway") as url,
        SyncEpochServiceClient(url, "t") as client,
        pytest.raises(EpochServiceUnavailable, match="502"),
    ):
        client.send(api.ready())
