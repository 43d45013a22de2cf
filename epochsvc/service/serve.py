"""``mcp-epoch serve``: run the epoch service under uvicorn and say where it listens."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import resource
import socket
import sys
from types import FrameType

import uvicorn

from epochsvc import logs
from epochsvc.service.app import create_app, resolve_auth
from epochsvc.service.headers import bounded
from epochsvc.service.longpoll import ChangeNotifier
from epochsvc.service.settings import Settings
from epochsvc.service.store import StoreUnavailable, open_store
from epochsvc.service.store.engines import describe_url


class _AnnouncingServer(uvicorn.Server):
    """Prints the listening address once the app has started (lifespan done, store open), and
    on the exit signal answers the long polls at once (uvicorn waits for open requests before
    it shuts the app down, and a long poll would hold it for its whole wait)."""

    announce = ""
    notifiers: tuple[ChangeNotifier, ...] = ()
    _loop: asyncio.AbstractEventLoop | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().startup(sockets)
        if self.started:
            print(self.announce, flush=True)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self._loop is not None:
            for notifier in self.notifiers:
                self._loop.call_soon_threadsafe(notifier.close)
        super().handle_exit(sig, frame)


LISTEN_BACKLOG = 4096
#: Descriptors kept for the ledger, logs and the process's own use.
RESERVED_FILES = 64


#: Collector thresholds: Python's own for the young generations, and a full collection only
#: after 1,000 of the middle one's instead of 10. Every held long poll is a connection with its
#: objects, all long-lived; each full collection walked every one of them. Holding 10,000, the
#: service spent 6.6 s of one benchmark run in full collections, single pauses up to 565 ms,
#: longer than waking them all takes (bench longpoll). Cyclic garbage is still collected young,
#: where nearly all of it dies.
GC_THRESHOLDS = (700, 10, 1000)


def quiet_collector() -> None:
    """Set :data:`GC_THRESHOLDS` for this process (the service's own, never the library's)."""
    gc.set_threshold(*GC_THRESHOLDS)


def raise_open_files_limit() -> int:
    """Every held long poll is a connection: take the open-file limit up to its hard limit
    (allowed without privileges) and return the limit in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        hard = max(soft, 1 << 20)
    if soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def serve(host: str, port: int, log_level: str | None = None) -> int:
    try:
        settings = Settings()
        auth, generated = resolve_auth(settings)
    except (ValueError, OSError) as exc:  # ssl.SSLError (an unreadable CA file) is an OSError
        print(f"mcp-epoch serve: invalid settings: {exc}", file=sys.stderr)
        return 2
    level = log_level or settings.log_level
    logs.configure(level)
    try:
        store = asyncio.run(open_store(settings.database_url))
    except PermissionError as exc:
        print(
            f"mcp-epoch serve: cannot open the ledger: {exc}; this process (UID {os.getuid()}, "
            f"GID {os.getgid()}) cannot write there: give the volume to the pod's fsGroup "
            "(the chart sets 10001) or make it writable by this user",
            file=sys.stderr,
        )
        return 1
    except (RuntimeError, ValueError, OSError, StoreUnavailable) as exc:
        print(f"mcp-epoch serve: cannot open the ledger: {exc}", file=sys.stderr)
        return 1
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        print(f"mcp-epoch serve: cannot listen on {host}:{port}: {exc}", file=sys.stderr)
        asyncio.run(store.close())
        return 1
    bound_port = sock.getsockname()[1]
    url_host = f"[{host}]" if family == socket.AF_INET6 else host
    for role in generated:
        value = getattr(auth, role)
        print(
            f"generated {role} token (set EPOCHSVC_{role.upper()}_TOKEN to choose one): {value}",
            flush=True,
        )
    app = create_app(settings, auth, store)
    quiet_collector()
    open_files = raise_open_files_limit()
    config = uvicorn.Config(
        app.front,  # the app itself would add its own call to every request's frames
        log_config=None,
        log_level=level,
        access_log=level == "debug",
        timeout_graceful_shutdown=5,
        http=bounded(settings.max_header_bytes),
        # Thousands of replicas reconnect their long polls at once after a restart.
        backlog=LISTEN_BACKLOG,
    )
    server = _AnnouncingServer(config)
    server.notifiers = (app.state.notifier, app.state.ring_notifier)
    server.announce = (
        f"epoch service listening on http://{url_host}:{bound_port} "
        f"(ledger {store.ledger_id[:8]} in {describe_url(settings.database_url)}); "
        f"room for about {max(0, open_files - RESERVED_FILES)} connections at once, long "
        f"polls included (open-file limit {open_files})"
    )
    server.run(sockets=[sock])
    return 0 if server.started else 1
