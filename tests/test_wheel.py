"""What users install is what is released: the sdist and the wheel built from this tree with
``uv build``, as the release workflow builds them. The wheel goes into a clean virtual
environment with only the ``mcp`` extra, its dependencies pinned by the lock (hashes checked),
and the example server runs from it and answers a tool call with progress."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import httpx

from tests.replica.conftest import EXAMPLE, RawSession, wait_port
from tests.support.ports import free_port

ROOT = Path(__file__).resolve().parents[1]
UV = Path(sys.executable).with_name("uv")
MCP = ["--extra", "mcp", "--output-file"]


def _run(argv: list[str | Path], cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [str(a) for a in argv], capture_output=True, text=True, timeout=900, cwd=cwd, check=False
    )
    assert done.returncode == 0, f"{argv[:3]} exited {done.returncode}:\n{done.stderr[-3000:]}"
    return done


def test_the_wheel_with_the_mcp_extra_alone_serves_the_example(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    _run([UV, "build", "--out-dir", dist], cwd=ROOT)
    (wheel,) = dist.glob("mcp_epoch-*.whl")
    (sdist,) = dist.glob("mcp_epoch-*.tar.gz")
    with tarfile.open(sdist) as tar:  # the sources the wheel is built from
        names = {name.split("/", 1)[-1] for name in tar.getnames()}
    assert {"pyproject.toml", "mcp_epoch/__init__.py", "mcp_epoch/py.typed"} <= names

    pins = tmp_path / "requirements.txt"
    _run(
        [
            UV,
            "export",
            "--frozen",
            "--no-dev",
            "--no-emit-project",
            "--no-header",
            "--extra",
            "mcp",
            "--output-file",
            pins,
        ],
        cwd=ROOT,
    )
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", venv])
    python = venv / "bin" / "python"
    _run([python, "-m", "pip", "install", "--quiet", "--require-hashes", "-r", pins])
    _run([python, "-m", "pip", "install", "--quiet", "--no-deps", wheel])
    # Only the library and the SDK: the service's and the operator's dependencies are absent.
    absent = subprocess.run([python, "-c", "import fastapi"], capture_output=True, check=False)
    assert absent.returncode != 0
    where = _run([python, "-c", "import mcp_epoch; print(mcp_epoch.__file__)"], cwd=tmp_path)
    assert where.stdout.startswith(str(venv)), where.stdout  # not this checkout's

    example = tmp_path / "epoch_server.py"
    shutil.copy(EXAMPLE, example)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("MCP_")}
    proc = subprocess.Popen(
        [str(python), str(example), "--port", str(port)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        announced = json.loads(proc.stdout.readline() or "{}")
        assert announced.get("epoch"), "the example server did not start (its stderr above)"
        wait_port(port, proc)
        _call_a_tool(f"http://127.0.0.1:{port}/mcp")
    finally:
        proc.terminate()
        proc.wait(30)


def _call_a_tool(url: str) -> None:
    with httpx.Client(timeout=30.0) as http:
        events = RawSession(url, http).initialize().countdown(3, delay=0)
    messages = [json.loads(e.data) for e in events if e.data]
    assert sum(m.get("method") == "notifications/progress" for m in messages) == 3
    assert messages[-1]["result"]["content"][0]["text"] == "done 3"
    # Every event carries the library's ID: this process's epoch, then a sequence number.
    ids = [e.id for e in events if e.id]
    assert ids and all(":" in i for i in ids), ids
