"""MCP servers nobody here wrote, as real processes on loopback, and the sidecar in front.

Four upstreams, each started as its own users start it, each printing ``{"port", ...}``:

* ``ts``: the TypeScript SDK 1.32 server, stateful, without an event store (the common set-up);
* ``ts-example-store``: the same server with the SDK's example event store;
* ``go``: a Go SDK 1.8 server (built from the module proxy, pinned in ``go_server/go.sum``);
* ``python``: a Python SDK server, unwrapped (``streamable_http_app()``, no event store).

The TypeScript server is the demo's (``epochsvc/demo/upstream``, from its npm lock).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from epochsvc.demo import upstream as ts_upstream
from tests.clients.probes import go_binary
from tests.support.ports import free_port

HERE = Path(__file__).resolve().parent
KINDS = ("ts", "ts-example-store", "go", "python")


def go_server() -> list[str]:
    return go_binary(HERE / "go_server", "goserver")


def upstream_command(kind: str, name: str, port: int = 0) -> list[str]:
    if kind == "ts":
        return ts_upstream.command(name, port=port)
    if kind == "ts-example-store":
        return ts_upstream.command(name, port=port, store="example")
    if kind == "go":
        return [*go_server(), "-port", str(port), "-name", name]
    if kind == "python":
        return [
            sys.executable,
            "-m",
            "tests.sidecar.py_server",
            "--port",
            str(port),
            "--name",
            name,
        ]
    raise ValueError(kind)


@dataclass
class Proc:
    proc: subprocess.Popen[str]
    port: int
    log: Path | None = None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def start_upstream(kind: str, name: str = "u1", port: int = 0) -> Proc:
    proc = subprocess.Popen(
        upstream_command(kind, name, port),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={k: v for k, v in os.environ.items() if not k.startswith("MCP_")},
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        proc.wait(5)
        raise RuntimeError(f"the {kind} server exited with {proc.returncode}")
    return Proc(proc, int(json.loads(line)["port"]))


@dataclass
class Sidecar(Proc):
    upstream: Proc | None = None
    env: dict[str, str] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def metric(self, name: str) -> float:
        text = httpx.get(f"http://127.0.0.1:{self.port}/metrics").text
        for line in text.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        raise KeyError(name)


def start_sidecar(
    upstream_port: int, env: dict[str, str] | None = None, log: Path | None = None
) -> Sidecar:
    """``mcp-epoch proxy`` in front of ``127.0.0.1:<upstream_port>``, once it is ready."""
    port = free_port()
    full = {k: v for k, v in os.environ.items() if not k.startswith("MCP_")}
    full.update(env or {})
    cmd = [
        sys.executable,
        "-m",
        "epochsvc.cli",
        "proxy",
        "--upstream",
        f"127.0.0.1:{upstream_port}",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--retry-ms",
        "100",
    ]
    err = log.open("w") if log is not None else subprocess.DEVNULL
    proc = subprocess.Popen(cmd, env=full, stdout=subprocess.DEVNULL, stderr=err, text=True)
    sidecar = Sidecar(proc, port, log, env=env or {})
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # polling a condition the process reaches by itself
        if proc.poll() is not None:
            raise RuntimeError(f"the sidecar exited with {proc.returncode}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200:
                return sidecar
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    sidecar.stop()
    raise TimeoutError("the sidecar never became ready")
