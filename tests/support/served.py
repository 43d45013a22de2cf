"""An ASGI app served by uvicorn on loopback, in a thread of the test's own process: for tests
that need the real server and also the app's objects (its store, its metrics)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Literal

import uvicorn
from starlette.types import ASGIApp


@contextmanager
def served(app: ASGIApp, lifespan: Literal["on", "off"] = "on") -> Iterator[str]:
    """Serve ``app`` until the block ends; yields its base URL. ``lifespan="off"`` serves a
    second front of an app another server already started."""
    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan=lifespan)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        if not thread.is_alive():
            raise RuntimeError("the server stopped before it started listening; see its log")
        threading.Event().wait(0.02)  # uvicorn offers no event for "listening"
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)
