"""``mcp_epoch.serve`` freezes what is alive once its server has started (the process is the
server's), and a ``DrainingServer`` that does not own its process freezes nothing.

Run in a child process: a freeze is process-wide, and must not reach the test session's heap.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

CHILD = textwrap.dedent(
    """
    import asyncio, gc, sys
    import uvicorn
    from mcp_epoch._internal.serve import DrainingServer

    async def app(scope, receive, send):
        pass

    async def main(freeze):
        config = uvicorn.Config(app, host="127.0.0.1", port=0, lifespan="off", log_level="error")
        config.load()
        server = DrainingServer(config, None, freeze=freeze)
        server.lifespan = config.lifespan_class(config)
        await server.startup()
        frozen = gc.get_freeze_count()
        await server.shutdown()
        return frozen

    print(asyncio.run(main(sys.argv[1] == "freeze")))
    """
)


def _frozen(mode: str) -> int:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, mode], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    return int(out.stdout.strip())


def test_the_process_server_freezes_its_startup_objects_and_a_guest_none() -> None:
    assert _frozen("freeze") > 10_000  # the interpreter, uvicorn, mcp_epoch: all startup state
    assert _frozen("no") == 0
