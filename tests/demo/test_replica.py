"""The demo replica's process hygiene: its TypeScript server never outlives it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1].startswith("Z")  # a zombie has exited
    except FileNotFoundError:
        return True


def test_the_upstream_server_ends_when_its_replica_is_killed() -> None:
    """A replica SIGKILLed at the end of its grace period runs no clean-up: the server it
    started must still end (the demo's sidecar fleet used to leave them running)."""
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import os, subprocess, sys\n"
            "from epochsvc.demo.replica import _end_with\n"
            "child = subprocess.Popen(['sleep', '600'], preexec_fn=_end_with(os.getpid()))\n"
            "print(child.pid, flush=True)\n"
            "sys.stdin.read()\n",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    try:
        assert not _gone(child)
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        deadline = time.monotonic() + 10
        while not _gone(child):
            assert time.monotonic() < deadline, "the server outlived its SIGKILLed replica"
            time.sleep(0.02)
    finally:
        if not _gone(child):
            os.kill(child, signal.SIGKILL)
