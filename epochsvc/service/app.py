"""The FastAPI application: wiring of store, auth, routers, metrics and the sweeper."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from epochsvc.service.auth import Tokens
from epochsvc.service.errors import install_error_handlers
from epochsvc.service.limits import BodyLimit
from epochsvc.service.longpoll import ChangeNotifier
from epochsvc.service.metrics import Metrics, ObserveLatency
from epochsvc.service.routers import epochs, health, servers
from epochsvc.service.settings import Settings
from epochsvc.service.store import EpochStore, StoreUnavailable, open_store
from mcp_epoch import __version__

log = logging.getLogger("epochsvc")


def resolve_tokens(settings: Settings) -> tuple[Tokens, list[str]]:
    """Tokens from settings; missing ones are generated (and named, so they can be printed)."""
    generated = []
    values = {}
    for role in ("operator", "replica"):
        secret = getattr(settings, f"{role}_token")
        if secret is None or not secret.get_secret_value():
            values[role] = secrets.token_urlsafe(32)
            generated.append(role)
        else:
            values[role] = secret.get_secret_value()
    if values["operator"] == values["replica"]:
        raise ValueError("EPOCHSVC_OPERATOR_TOKEN and EPOCHSVC_REPLICA_TOKEN must differ")
    return Tokens(operator=values["operator"], replica=values["replica"]), generated


async def _sweep_forever(app: FastAPI) -> None:
    """Abandon pending epochs whose pod never appeared; compact old tombstones."""
    settings: Settings = app.state.settings
    store: EpochStore = app.state.store
    while True:
        await asyncio.sleep(settings.sweep_interval_seconds)
        try:
            result = await store.sweep(
                time.time(), settings.pending_timeout_seconds, settings.tombstone_ttl_seconds
            )
        except StoreUnavailable as exc:
            log.warning("sweep skipped: %s", exc)
            continue
        if result.abandoned or result.compacted:
            app.state.notifier.notify()
            log.info(
                "swept ledger",
                extra={"abandoned": result.abandoned, "compacted": result.compacted},
            )


def create_app(
    settings: Settings | None = None,
    tokens: Tokens | None = None,
    store: EpochStore | None = None,
) -> FastAPI:
    """The service; ``store`` is opened here unless the caller opened it (``serve`` does, to
    report a bad database URL or a locked ledger as one clear line before listening)."""
    settings = settings or Settings()
    if tokens is None:
        tokens, _ = resolve_tokens(settings)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.store = store or await open_store(settings.database_url)
        app.state.store.on_change = app.state.notifier.notify
        await app.state.store.attach()
        sweeper = asyncio.create_task(_sweep_forever(app), name="epochsvc-sweeper")
        try:
            yield
        finally:
            sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sweeper
            await app.state.store.close()

    app = FastAPI(
        title="mcp-epoch epoch service",
        version=__version__,
        description="Issues monotonic, never-reused epochs and knows which are live.",
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.tokens = tokens
    app.state.notifier = ChangeNotifier()
    app.state.metrics = Metrics()
    install_error_handlers(app)
    # Refuses oversized bodies, declared or streamed, before anything parses them.
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)
    for module in (epochs, servers, health):
        app.include_router(module.router)

    app.add_middleware(ObserveLatency, metrics=app.state.metrics)
    return app
