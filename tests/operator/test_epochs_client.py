"""The operator's epoch service client against a real service process, and the CLI's checks."""

from __future__ import annotations

import argparse
import asyncio
import socket
import time

import pytest
from mcp_epoch_operator.epochs import (
    EpochServiceClient,
    EpochServiceError,
    EpochServiceUnavailable,
    RetryPolicy,
)

from epochsvc.cli import build_parser
from tests.support.epochsvc_proc import EpochServiceProcess
from tests.support.ports import free_port

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_issue_is_idempotent_and_lifecycle_calls_work(
    epoch_service: EpochServiceProcess,
) -> None:
    client = EpochServiceClient(epoch_service.url, epoch_service.operator_token)
    try:
        first = await client.issue("ns", "echo", "req-1")
        again = await client.issue("ns", "echo", "req-1")
        assert first["epoch"] == again["epoch"] and first["state"] == "pending"
        other = await client.issue("ns", "echo", "req-2")
        assert other["generation"] > first["generation"]
        assert (await client.call("bind", first["epoch"], "p", "uid-1"))["state"] == "live"
        assert (await client.call("drain", first["epoch"], "p", "uid-1"))["state"] == "draining"
        assert (await client.call("retire", first["epoch"], "p", "uid-1"))["state"] == "retired"
        listing = await client.list_server("ns", "echo")
        states = {e["epoch"]: e["state"] for e in listing["epochs"]}
        assert states == {first["epoch"]: "retired", other["epoch"]: "pending"}
        with pytest.raises(EpochServiceError) as info:
            await client.retire(other["epoch"])  # pending epochs cannot be retired
        assert info.value.status == 409 and info.value.code == "illegal-transition"
        with pytest.raises(EpochServiceError) as info:
            await client.bind(first["epoch"], "q", "uid-other")
        assert info.value.code == "pod-mismatch"
    finally:
        await client.aclose()


async def test_wrong_token_is_an_error_not_an_outage(epoch_service: EpochServiceProcess) -> None:
    client = EpochServiceClient(epoch_service.url, "not-the-token")
    try:
        with pytest.raises(EpochServiceError) as info:
            await client.issue("ns", "echo", "req-1")
        assert info.value.status == 403
    finally:
        await client.aclose()


async def test_unreachable_service_fails_within_the_deadline() -> None:
    client = EpochServiceClient(f"http://127.0.0.1:{free_port()}", "t")
    policy = RetryPolicy(deadline=1.0, attempt_timeout=0.5, first_backoff=0.05)
    began = time.monotonic()
    try:
        with pytest.raises(EpochServiceUnavailable, match="Connect"):
            await client.issue("ns", "echo", "req-1", policy=policy)
    finally:
        await client.aclose()
    assert time.monotonic() - began < 2.0


async def test_a_silent_service_is_named_as_silent() -> None:
    # A listening socket nobody accepts from: connects succeed, answers never come.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        port = silent.getsockname()[1]
        client = EpochServiceClient(f"http://127.0.0.1:{port}", "t")
        policy = RetryPolicy(deadline=1.0, attempt_timeout=0.4, first_backoff=0.05)
        try:
            with pytest.raises(
                EpochServiceUnavailable, match=r"no answer within 0.4s \(\d+ attempts"
            ):
                await client.issue("ns", "echo", "req-1", policy=policy)
        finally:
            await client.aclose()


async def test_a_restarted_service_is_reached_by_retries(
    epoch_service: EpochServiceProcess,
) -> None:
    epoch_service.stop()
    client = EpochServiceClient(epoch_service.url, epoch_service.operator_token)
    try:
        restart = asyncio.get_running_loop().run_in_executor(None, epoch_service.start)
        issued = await client.issue("ns", "echo", "req-r", policy=RetryPolicy(deadline=30.0))
        await restart
        assert issued["state"] == "pending"
    finally:
        await client.aclose()


def parse(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["operator", *argv])


def test_cli_refuses_to_start_without_url_or_token(monkeypatch: pytest.MonkeyPatch) -> None:
    from mcp_epoch_operator import cli

    monkeypatch.delenv("MCP_EPOCH_OPERATOR_TOKEN", raising=False)
    monkeypatch.delenv("MCP_EPOCH_SERVICE_URL", raising=False)
    assert cli.run(parse()) == 2
    assert cli.run(parse("--epoch-service-url", "http://x")) == 2
    monkeypatch.setenv("MCP_EPOCH_OPERATOR_TOKEN", "t")
    assert cli.run(parse("--epoch-service-url", "http://x", "--register-webhook")) == 2
    assert cli.run(parse("--epoch-service-url", "http://x", "--webhook-port", "9443")) == 2


def test_cli_scope_flags_are_exclusive() -> None:
    with pytest.raises(SystemExit):
        parse("--all-namespaces", "--namespace", "a")
    assert parse("--namespace", "a", "--namespace", "b").namespace == ["a", "b"]


def test_cli_module_does_not_import_kopf() -> None:
    import subprocess
    import sys

    code = "import sys, mcp_epoch_operator.cli; print('kopf' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
