"""The epoch service as a real process (``mcp-epoch serve``) on a loopback port."""

from __future__ import annotations

import os
import re
import secrets
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TypeVar

import httpx
from pydantic import BaseModel

from mcp_epoch import api
from mcp_epoch.api import Call
from mcp_epoch.api_client import SyncEpochServiceClient

_LISTEN_RE = re.compile(r"listening on (http://\S+)")


M = TypeVar("M", bound=BaseModel)


class EpochServiceProcess:
    """Start, kill -9, stop and restart one epoch service process on one store.

    The port is chosen once and kept across restarts, so clients can reconnect to the same URL.
    """

    def __init__(
        self, database_url: str, log_path: Path, *, netns: str | None = None, **env: str
    ) -> None:
        """``netns``: run the process in that network namespace (its address is then
        reachable only from inside it)."""
        self.database_url = database_url
        self._in_ns = ["ip", "netns", "exec", netns] if netns else []
        self.log_path = log_path
        self.operator_token = secrets.token_urlsafe(24)
        self.replica_token = secrets.token_urlsafe(24)
        self.extra_env = env
        self.port = 0
        self.url = ""
        self.proc: subprocess.Popen[str] | None = None

    @property
    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "EPOCHSVC_AUTH": "static",
            "EPOCHSVC_DATABASE_URL": self.database_url,
            "EPOCHSVC_OPERATOR_TOKEN": self.operator_token,
            "EPOCHSVC_REPLICA_TOKEN": self.replica_token,
            **self.extra_env,
        }

    def start(self, timeout: float = 30.0) -> EpochServiceProcess:
        assert self.proc is None, "already running"
        log = self.log_path.open("a")
        self.proc = subprocess.Popen(
            [
                *self._in_ns,
                sys.executable,
                "-m",
                "epochsvc.cli",
                "serve",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
            ],
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
        )
        found: list[str] = []
        assert self.proc.stdout is not None
        stdout = self.proc.stdout

        def read() -> None:  # owns the log file: closes it when the process's stdout ends
            with log:
                for line in stdout:
                    log.write(line)
                    log.flush()
                    m = _LISTEN_RE.search(line)
                    if m and not found:
                        found.append(m.group(1))

        threading.Thread(target=read, daemon=True).start()
        deadline = time.monotonic() + timeout
        while not found:
            if self.proc.poll() is not None:
                raise RuntimeError(f"epoch service exited early; log:\n{self.tail()}")
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"epoch service did not start; log:\n{self.tail()}")
            time.sleep(0.05)
        self.url = found[0]
        self.port = int(self.url.rsplit(":", 1)[1])
        return self

    def __enter__(self) -> EpochServiceProcess:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    def tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text().splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def kill(self) -> None:
        """SIGKILL: no shutdown handlers run, as in a crash or an OOM kill."""
        if self.proc is not None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
            self.proc = None

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
            self.proc = None

    def restart(self) -> EpochServiceProcess:
        self.stop()
        return self.start()

    # --- operator-side shortcuts for tests -----------------------------------------------

    def api(self, token: str | None = None) -> SyncEpochServiceClient:
        """The shared typed client, as the operator (or with ``token``)."""
        return SyncEpochServiceClient(self.url, token or self.operator_token)

    def send(self, call: Call[M]) -> M:
        """One call as the operator; it must succeed."""
        with self.api() as client:
            return client.send(call)

    def issue(self, namespace: str, server: str, uid: str) -> str:
        return self.send(api.issue(namespace, server, uid)).epoch

    def live(self, namespace: str, server: str, uid: str) -> str:
        """Issue and bind a pod epoch, as the webhook and the operator would."""
        epoch = self.issue(namespace, server, uid)
        self.send(api.bind(epoch, f"pod-{uid}", f"uid-{uid}"))
        return epoch

    def replica_env(self, epoch: str, namespace: str, server: str) -> dict[str, str]:
        """The environment the operator gives an MCP server container: a bound epoch's pod
        name and UID come from the ledger, as a real pod reads its own (Downward API)."""
        record = self.send(api.get_epoch(epoch))
        env = {
            "MCP_EPOCH": epoch,
            "MCP_EPOCH_SERVICE_URL": self.url,
            "MCP_EPOCH_SERVICE_TOKEN": self.replica_token,
            "MCP_SERVER_NAMESPACE": namespace,
            "MCP_SERVER_NAME": server,
            "MCP_POD_NAME": record.pod_name or f"pod-{epoch}",
        }
        if record.pod_uid:
            env["MCP_POD_UID"] = record.pod_uid
        return env

    def client(self, token: str | None = None, timeout: float = 10.0) -> httpx.Client:
        """Raw HTTP as the operator (or with ``token``): for tests of the API's own surface
        (statuses, headers, bodies the models would refuse to build)."""
        headers = {"Authorization": f"Bearer {token or self.operator_token}"}
        return httpx.Client(base_url=self.url, headers=headers, timeout=timeout)

    def async_client(self, token: str | None = None, timeout: float = 10.0) -> httpx.AsyncClient:
        headers = {"Authorization": f"Bearer {token or self.operator_token}"}
        return httpx.AsyncClient(base_url=self.url, headers=headers, timeout=timeout)
