"""A benchmark's own server process: started on a free port, ready once it has printed its line.

The benchmark servers here print one JSON line once they listen (``bench.longpoll_floor``
through :func:`run_announcing`; ``bench.guard_server``, which picks its own ports, prints its
own), so waiting for that line is the readiness check, with no polling.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Sequence
from typing import Any

import uvicorn

from tests.support.ports import free_port


def start_server(
    module: str, *args: str, env: dict[str, str] | None = None
) -> tuple[subprocess.Popen[str], int]:
    """``python -m module --port=P *args``, once it listens; returns the process and P."""
    port = free_port()
    proc, _ = start_announcing(module, f"--port={port}", *args, env=env)
    return proc, port


def start_announcing(
    module: str,
    *args: str,
    env: dict[str, str] | None = None,
    prefix: Sequence[str] = (),
) -> tuple[subprocess.Popen[str], dict[str, Any]]:
    """``python -m module *args`` (run by ``prefix``, such as valgrind, if given), once it
    listens; returns the process and the JSON line it printed then."""
    proc = subprocess.Popen(
        [*prefix, sys.executable, "-m", module, *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        raise RuntimeError(f"{module} exited with {proc.wait(5)} before it listened")
    announced: dict[str, Any] = json.loads(line)
    return proc, announced


def run_announcing(server: uvicorn.Server, announce: Callable[[], None]) -> None:
    """Run ``server``, calling ``announce`` (which prints the line) once it listens."""
    original = server.startup

    async def startup(sockets: Any = None) -> None:
        await original(sockets)
        announce()

    server.startup = startup  # type: ignore[method-assign]
    server.run()
