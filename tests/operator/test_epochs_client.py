"""The operator CLI's checks before it starts (the epoch service client itself is
tests/test_api_client.py)."""

from __future__ import annotations

import argparse

import pytest

from epochsvc.cli import build_parser


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
