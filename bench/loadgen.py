"""Build (once, cached outside the repository) and run the Go load generator in bench/loadgen."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SOURCE = Path(__file__).parent / "loadgen"


@dataclass(frozen=True)
class Load:
    requests: int
    errors: int
    per_sec: float
    p50_ms: float
    p99_ms: float
    first_error: str = ""


def binary() -> Path:
    digest = hashlib.sha256(
        b"".join(p.read_bytes() for p in sorted(SOURCE.glob("*")) if p.is_file())
    ).hexdigest()[:12]
    cache = Path(os.environ.get("MCP_EPOCH_CACHE", Path.home() / ".cache" / "mcp-epoch"))
    out = cache / "bench" / f"loadgen-{digest}"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        print("building the Go load generator (once)...", flush=True)
        subprocess.run(["go", "build", "-o", str(out), "."], cwd=SOURCE, check=True)
    return out


def run(
    urls: list[str],
    *,
    clients: int,
    seconds: float,
    method: str = "GET",
    body: str = "",
    token: str = "",
    status: int = 0,
    headers: dict[str, str] | None = None,
    whole: bool = False,
) -> Load:
    """Closed-loop load; ``whole`` times each request until its body is read (a stream)."""
    argv = [
        str(binary()),
        f"-method={method}",
        f"-urls={','.join(urls)}",
        f"-c={clients}",
        f"-d={seconds}s",
        f"-status={status}",
    ]
    if body:
        argv.append(f"-body={body}")
    if token:
        argv.append(f"-token={token}")
    argv += [f"-header={name}: {value}" for name, value in (headers or {}).items()]
    if whole:
        argv.append("-whole")
    out = subprocess.run(argv, check=True, capture_output=True, text=True).stdout
    return Load(**json.loads(out))


def run_longpoll(
    poll_url: str,
    *,
    waiters: int,
    trigger_url: str,
    trigger_body: str,
    health_url: str,
    metrics_url: str,
    token: str,
) -> dict[str, Any]:
    """Hold ``waiters`` long polls, change the server once, report wake-up and /healthz."""
    argv = [
        str(binary()),
        "-mode=longpoll",
        f"-urls={poll_url}",
        f"-waiters={waiters}",
        f"-trigger={trigger_url}",
        f"-body={trigger_body}",
        f"-health={health_url}",
        f"-metrics={metrics_url}",
        f"-token={token}",
    ]
    out = subprocess.run(argv, check=True, capture_output=True, text=True, timeout=600).stdout
    result: dict[str, Any] = json.loads(out)
    return result
