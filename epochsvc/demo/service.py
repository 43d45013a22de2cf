"""The epoch service as the demo runs it: ``mcp-epoch serve`` on a fresh SQLite ledger.

The demo plays the operator, so it needs the operator's calls (issue, bind, drain, retire: the
shared client of :mod:`mcp_epoch.api_client`) and the replica token to hand to the replicas;
both tokens are generated here for this run only.
"""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path

from mcp_epoch.api_client import EpochServiceClient, RetryPolicy

_LISTEN = re.compile(r"listening on (http://\S+)")
#: The demo's lifecycle calls: attempts of up to 10 s each, retried for up to 30 s.
LIFECYCLE_RETRIES = RetryPolicy(deadline=30.0, attempt_timeout=10.0)


class EpochService:
    """One ``mcp-epoch serve`` process on loopback; its log goes to ``workdir/epochsvc.log``."""

    def __init__(self, workdir: Path, env: Mapping[str, str] | None = None) -> None:
        self.workdir = workdir
        self.env = dict(env or {})
        self.operator_token = secrets.token_urlsafe(24)
        self.replica_token = secrets.token_urlsafe(24)
        self.url = ""
        self._proc: subprocess.Popen[str] | None = None

    def start(self, timeout: float = 30.0) -> None:
        env = {
            **os.environ,
            "EPOCHSVC_AUTH": "static",
            "EPOCHSVC_DATABASE_URL": f"sqlite:///{self.workdir / 'ledger.db'}",
            "EPOCHSVC_OPERATOR_TOKEN": self.operator_token,
            "EPOCHSVC_REPLICA_TOKEN": self.replica_token,
            "EPOCHSVC_LOG_LEVEL": "warning",
            **self.env,
        }
        log = (self.workdir / "epochsvc.log").open("a")
        cmd = [sys.executable, "-m", "epochsvc.cli", "serve", "--host", "127.0.0.1", "--port", "0"]
        self._proc = proc = subprocess.Popen(
            cmd, env=env, stdout=subprocess.PIPE, stderr=log, text=True
        )
        found = threading.Event()

        def pump() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                m = _LISTEN.search(line)
                if m and not found.is_set():
                    self.url = m.group(1)
                    found.set()

        threading.Thread(target=pump, name="epochsvc-stdout", daemon=True).start()
        deadline = time.monotonic() + timeout
        while not found.wait(0.05):
            if proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the epoch service did not start; see {log.name}")

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)

    def client(self) -> EpochServiceClient:
        """An operator-credentialed client for the lifecycle calls, retrying an attempt that
        got no answer, as the operator does. Every one of them is legal to repeat (an issue by
        its request UID, a bind of the same pod, a drain or a retire again). Without retries, a
        pooled connection the service closed as idle just as a call went out on it (its
        keep-alive timeout, met on a busy machine) failed a whole demo run with a ReadError."""
        return EpochServiceClient(self.url, self.operator_token, policy=LIFECYCLE_RETRIES)
