"""The epoch service as the demo runs it: ``mcp-epoch serve`` on a fresh SQLite ledger.

The demo plays the operator, so it needs the operator's calls (issue, bind, drain, retire) and
the replica token to hand to the replicas; both tokens are generated here for this run only.
"""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

_LISTEN = re.compile(r"listening on (http://\S+)")


class EpochService:
    """One ``mcp-epoch serve`` process on loopback; its log goes to ``workdir/epochsvc.log``."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
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

    def client(self) -> httpx.AsyncClient:
        """An operator-credentialed client for the lifecycle calls."""
        return httpx.AsyncClient(
            base_url=self.url,
            headers={"Authorization": f"Bearer {self.operator_token}"},
            timeout=10.0,
        )


async def operator_call(
    client: httpx.AsyncClient, path: str, body: dict[str, Any] | None = None
) -> dict[str, Any]:
    """POST as the operator; anything but 200/201 is a bug in the demo, so it raises."""
    resp = await client.post(path, json=body or {})
    if resp.status_code not in (200, 201):
        raise RuntimeError(f"epoch service: POST {path} -> {resp.status_code} {resp.text[:200]}")
    data: dict[str, Any] = resp.json()
    return data


def epoch_path(epoch: str, action: str) -> str:
    return f"/v1/epochs/{quote(epoch, safe='')}/{action}"
