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
from starlette.types import ASGIApp, Receive, Scope, Send

from epochsvc.service.access import Access
from epochsvc.service.auth import Authenticator, KubernetesAuth, Tokens
from epochsvc.service.errors import install_error_handlers
from epochsvc.service.held import HeldPolls
from epochsvc.service.identity import SA_PREFIX, ApiServer, TokenReviewer
from epochsvc.service.leanissue import LeanIssue
from epochsvc.service.limits import BodyLimit
from epochsvc.service.listings import RenderedLists
from epochsvc.service.longpoll import ChangeNotifier, ring_revision, ring_revisions
from epochsvc.service.metrics import Metrics, ObserveLatency
from epochsvc.service.routers import epochs, health, request_state, servers
from epochsvc.service.settings import Settings
from epochsvc.service.store import EpochStore, StoreUnavailable, open_store
from mcp_epoch import __version__

log = logging.getLogger("epochsvc")


def resolve_auth(settings: Settings) -> tuple[Authenticator, list[str]]:
    """How callers are verified; with static tokens, missing ones are generated (and named,
    so they can be printed). Raises ValueError with what to set."""
    if settings.auth == "kubernetes":
        account = settings.operator_service_account
        if not account:
            raise ValueError(
                "EPOCHSVC_AUTH=kubernetes needs EPOCHSVC_OPERATOR_SERVICE_ACCOUNT "
                "(namespace/name of the operator's ServiceAccount)"
            )
        api = ApiServer.discover(
            settings.kube_api_url, settings.kube_ca_file, settings.kube_token_file
        )
        reviewer = TokenReviewer(
            api, settings.token_audience, cache_seconds=settings.token_cache_seconds
        )
        namespace, _, name = account.partition("/")
        return KubernetesAuth(reviewer, f"{SA_PREFIX}{namespace}:{name}"), []
    return _static_tokens(settings)


def _static_tokens(settings: Settings) -> tuple[Tokens, list[str]]:
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


class ServiceApp(FastAPI):
    """The service's app. Its :attr:`front` is what a server should run: the app behind the
    front that holds long polls (:mod:`.held`) and answers right issues (:mod:`.leanissue`);
    calling the app itself goes through it too."""

    _front: LeanIssue | None = None

    def build_middleware_stack(self) -> ASGIApp:
        """Outside the framework's own layers: every request's latency."""
        return ObserveLatency(super().build_middleware_stack(), self.state.metrics)

    @property
    def front(self) -> LeanIssue:
        """The front for long polls held after the routes checked them, outside even the
        framework's own calls, so that a held poll keeps none of their frames; and, outside
        that, the lean path of issuing. Served directly (``serve`` does), neither keeps even
        this app's call."""
        if self._front is None:
            metrics: Metrics = self.state.metrics
            held = HeldPolls(
                super().__call__, self.exception_handlers, observe=metrics.observe_request
            )
            self._front = LeanIssue(held, self)
        return self._front

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.front(scope, receive, send)


def create_app(
    settings: Settings | None = None,
    auth: Authenticator | None = None,
    store: EpochStore | None = None,
) -> ServiceApp:
    """The service; ``store`` is opened here unless the caller opened it (``serve`` does, to
    report a bad database URL or a locked ledger as one clear line before listening)."""
    settings = settings or Settings()
    if auth is None:
        auth, _ = resolve_auth(settings)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.store = store or await open_store(settings.database_url)
        app.state.store.on_change = app.state.notifier.notify
        app.state.access = Access(app.state.store)
        await app.state.store.attach()
        sweeper = asyncio.create_task(_sweep_forever(app), name="epochsvc-sweeper")
        # What no notification of this process announces (another service process's write
        # on PostgreSQL, when its notification was lost; any ring change of another process)
        # is found by the catch-up within ``poll_interval_seconds``.
        catch_ups = [
            asyncio.create_task(
                notifier.catch_up(app.state.store, settings.poll_interval_seconds),
                name=f"epochsvc-longpoll-catch-up-{kind}",
            )
            for kind, notifier in (
                ("epochs", app.state.notifier),
                ("ring", app.state.ring_notifier),
            )
        ]
        try:
            yield
        finally:
            for task in (sweeper, *catch_ups):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            await app.state.store.close()
            if isinstance(auth, KubernetesAuth):
                await auth.reviewer.close()

    app = ServiceApp(
        title="mcp-epoch epoch service",
        version=__version__,
        description="Issues monotonic, never-reused epochs and knows which are live.",
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.auth = auth
    app.state.notifier = ChangeNotifier()
    app.state.ring_notifier = ChangeNotifier(ring_revision, ring_revisions)
    app.state.lists = RenderedLists()
    app.state.metrics = Metrics()
    install_error_handlers(app, on_store_down=lambda: app.state.metrics.store_answered(False))
    # Refuses oversized bodies, declared or streamed, before anything parses them.
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)
    for module in (epochs, servers, request_state, health):
        app.include_router(module.router)
    return app
