"""The admission webhook's HTTPS server: a thread, an event loop and an epoch-service client of
its own; the admission lease's rounds run there too.

A pod create waits on this answer, so nothing else the operator does may delay it. kopf's own
webhook server answers on the loop that also runs every watch handler and reconcile. In a
200-pod burst (``python -m bench webhook``) that loop fell behind by up to 170 ms at a time,
and every await of an admission (reading the review, the issue call, its answer) queued behind
it: the operator's webhook time averaged ~250 ms around an issue call the epoch service
answered in ~21 ms. Here the review is read, decided and answered on this thread's loop. What
the rest of the operator learns from it (a server to reconcile, an Event to post, whether the
service answered) goes to kopf's loop through a :class:`Sink`, and is never waited for.

Epochs come from the pool of the process holding the admission lease (:mod:`.pool`,
:mod:`.lease`). Every operator process serves the webhook; one that does not hold the lease
relays the review, unchanged, to the holder, and waits (within the webhook's timeout) for a
holder while there is none. A review relayed once is never relayed again.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import secrets
import socket
import ssl
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import aiohttp
from aiohttp import web

from mcp_epoch import api
from mcp_epoch.api_client import EpochServiceClient, EpochServiceError, EpochServiceUnavailable
from mcp_epoch_operator import sidecar
from mcp_epoch_operator.config import OperatorConfig, WebhookServing
from mcp_epoch_operator.epochs import WEBHOOK_POLICY, client_for, send_counted
from mcp_epoch_operator.kube import KubeClient
from mcp_epoch_operator.lease import AdmissionLease
from mcp_epoch_operator.metrics import OperatorMetrics
from mcp_epoch_operator.names import WEBHOOK_PATH
from mcp_epoch_operator.pool import EpochPool, PoolUnavailable
from mcp_epoch_operator.runtime import Runtime
from mcp_epoch_operator.webhook import (
    SKIPPED,
    Refusal,
    Verdict,
    pod_patch,
    refusal_message,
    refused,
    review_response,
    target_of,
)

log = logging.getLogger("mcp_epoch_operator.admission")
Key = tuple[str, str]

#: The largest AdmissionReview read. The API server caps a request body at 3 MiB, and a review
#: of a pod carries the pod once (``oldObject`` is null on CREATE); anything larger is not one.
MAX_REVIEW_BYTES = 4 * 1024 * 1024
#: How often the serving certificate and key are checked for a rotation.
CERT_CHECK_SECONDS = 10.0
#: How long a stopping server lets admissions in flight finish (the webhook's own timeout).
DRAIN_SECONDS = 5.0
#: How long an admission waits for the lease's holder (or to become it) before it refuses
#: the pod: inside the webhook's 5 s timeout, so the API server gets a clear refusal.
HOLDER_WAIT_SECONDS = 3.5
#: Marks a relayed review: its receiver answers it itself or refuses it, never relays it on.
RELAYED_HEADER = "X-Mcp-Epoch-Relayed"
#: How often kopf's loop collects what admissions handed over (a server to reconcile, an
#: Event, the service's reachability): soon enough for a person, rare enough to cost nothing.
SINK_PERIOD = 0.05


class Sink(Protocol):
    """What an admission tells the rest of the operator. Called on the webhook's thread; an
    implementation hands each call over and returns at once."""

    def mark(self, key: Key) -> None: ...

    def reachable(self, ok: bool, message: str = "") -> None: ...

    def event(self, key: Key, type_: str, reason: str, message: str) -> None: ...

    def issued(self, key: Key, epoch: str, generation: int) -> None: ...


class LoopSink:
    """A :class:`Sink` onto the :class:`Runtime` on kopf's loop, which collects what was
    handed over every :data:`SINK_PERIOD` seconds.

    Not a ``call_soon_threadsafe`` per call: that wakes kopf's thread in the middle of the
    admission, and the two threads then take turns with the interpreter lock. Each wake cost
    the admission 5-20 ms in a busy rollout (``python -m bench webhook``), several times
    what the admission itself takes. Appending to a deque is atomic, so this thread never
    waits for kopf's."""

    def __init__(self, runtime: Runtime, loop: asyncio.AbstractEventLoop) -> None:
        self.runtime = runtime
        self.loop = loop
        self._handed: deque[tuple[Any, tuple[Any, ...]]] = deque()
        try:
            loop.call_soon_threadsafe(self._collect)
        except RuntimeError:  # kopf's loop has closed: the operator is exiting
            log.debug("operator loop closed; nothing handed over will run")

    def _collect(self) -> None:
        """On kopf's loop: run what was handed over, and look again a period later."""
        while self._handed:
            fn, args = self._handed.popleft()
            try:
                fn(*args)
            except Exception:
                log.exception("handing an admission's news to the operator failed")
        self.loop.call_later(SINK_PERIOD, self._collect)

    def _soon(self, fn: Any, *args: Any) -> None:
        self._handed.append((fn, args))

    def mark(self, key: Key) -> None:
        self._soon(self.runtime.mark, *key)

    def reachable(self, ok: bool, message: str = "") -> None:
        self._soon(self.runtime.set_reachable, ok, message)

    def event(self, key: Key, type_: str, reason: str, message: str) -> None:
        self._soon(self.runtime.events.post, key, type_, reason, message)

    def issued(self, key: Key, epoch: str, generation: int) -> None:
        self._soon(self.runtime.events.issued, key, epoch, generation)


class Admitter:
    """Decides one AdmissionReview: which pod, whether it gets an epoch, and the answer."""

    def __init__(
        self,
        config: OperatorConfig,
        svc: EpochServiceClient,
        metrics: OperatorMetrics,
        sink: Sink,
        pool: EpochPool,
        tenure: Callable[[], int | None],
    ) -> None:
        self.config = config
        self.svc = svc
        self.metrics = metrics
        self.sink = sink
        self.pool = pool
        self.tenure = tenure

    async def issue(self, namespace: str, server: str, request_uids: list[str]) -> list[api.Epoch]:
        """One durable batch issue (a part of a pool's refill), counted as every call to the
        service is."""
        call = api.issue_batch(namespace, server, request_uids)
        issued = await send_counted(
            self.svc, call, WEBHOOK_POLICY, self.metrics, self.sink.reachable
        )
        return issued.epochs

    async def admit(self, request: dict[str, Any]) -> Verdict:
        """The verdict for one ``AdmissionReview.request``; :class:`PoolUnavailable` when it
        needs an epoch and this process does not hold the admission lease."""
        kind = (request.get("kind") or {}).get("kind", "Pod")
        if request.get("operation") != "CREATE" or kind != "Pod" or request.get("subResource"):
            return SKIPPED  # the registered rules send pod CREATEs only; allow anything else
        try:
            target = target_of(request)
            if target is not None:
                sidecar.check(request.get("object") or {}, self.config.replica.sidecar_image)
        except (Refusal, sidecar.SidecarRefusal) as exc:
            return refused(400, f"mcp-epoch: {exc}")
        if target is None:
            return SKIPPED
        if request.get("dryRun"):
            # sideEffects NoneOnDryRun: a dry run must not issue an epoch.
            return Verdict(
                "skipped",
                True,
                warnings=("mcp-epoch: dry run, so no epoch was issued for this pod",),
            )
        key = (target.namespace, target.server)
        try:
            issued = await self.pool.take(key, target.request_uid, self.tenure)
        except EpochServiceUnavailable as exc:
            message = refusal_message(target, self.config.epoch_service_url, str(exc))
            self.sink.mark(key)
            self.sink.event(key, "Warning", "EpochServiceUnreachable", message)
            return refused(503, message)
        except EpochServiceError as exc:
            message = (
                f"mcp-epoch: the epoch service refused to issue an epoch for "
                f"{target.namespace}/{target.server}: {exc.message} ({exc.code})"
            )
            self.sink.event(key, "Warning", "EpochIssueFailed", message)
            return refused(exc.status if exc.status < 500 else 503, message)
        pod = request.get("object") or {}
        patch = pod_patch(pod, issued.epoch, target.server, self.config.replica)
        self.sink.mark(key)
        self.sink.issued(key, issued.epoch, issued.generation)
        return Verdict("issued", True, patch=patch)


def _bad_review(message: str) -> web.Response:
    return web.json_response({"error": f"mcp-epoch webhook: {message}"}, status=400)


def _files_stamp(*paths: Path) -> tuple[tuple[int, int], ...]:
    out = []
    for path in paths:
        st = path.stat()
        out.append((st.st_mtime_ns, st.st_size))
    return tuple(out)


class AdmissionServer:
    """Serves ``POST`` :data:`WEBHOOK_PATH` over HTTPS from a daemon thread.

    :meth:`start` returns once the port is listening (or raises why it cannot), so the
    operator registers its webhook only when it can answer. :meth:`stop` lets admissions in
    flight finish first.
    """

    def __init__(
        self,
        serving: WebhookServing,
        config: OperatorConfig,
        metrics: OperatorMetrics,
        sink: Sink,
        login: Callable[[], Any],
    ) -> None:
        self.serving = serving
        self.config = config
        self.metrics = metrics
        self.sink = sink
        self.login = login
        #: This process among the lease's candidates: unique even for two on one host.
        self.identity = (
            f"{os.environ.get('HOSTNAME') or socket.gethostname()}-{os.getpid()}-"
            f"{secrets.token_hex(3)}"
        )
        self.lease: AdmissionLease | None = None
        self._svc: EpochServiceClient | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._ready = threading.Event()
        self._failure: BaseException | None = None
        #: The SHA-256 of the certificate this process serves, which a relay pins: every
        #: operator replica serves the same one (one Secret). Read at start and at each reload.
        self._fingerprint = b""

    @property
    def retries(self) -> int:
        """Issue attempts this server's client repeated after an outage answer."""
        return self._svc.retries if self._svc is not None else 0

    def start(self, timeout: float = 30.0) -> None:
        self._thread = threading.Thread(target=self._main, name="mcp-epoch-webhook", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout):
            raise TimeoutError(f"the webhook server did not start listening within {timeout:g}s")
        if self._failure is not None:
            raise self._failure

    def stop(self) -> None:
        loop, stopping = self._loop, self._stopping
        if loop is not None and stopping is not None:
            with contextlib.suppress(RuntimeError):  # its loop has already ended
                loop.call_soon_threadsafe(stopping.set)
        if self._thread is not None:
            self._thread.join(DRAIN_SECONDS + 5.0)

    # ------------------------------------------------------------------ the thread

    def _main(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as exc:
            if not self._ready.is_set():
                self._failure = exc
                self._ready.set()
            else:
                log.exception("the webhook server stopped on an error")

    def _tls(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(self.serving.cert, self.serving.key)
        return context

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        context = self._tls()
        self._svc = client_for(self.config)
        kube = KubeClient(self.login)
        lease = self.lease = AdmissionLease(
            kube,
            self.config.operator_namespace,
            self.config.admission_lease,
            self.identity,
            self.serving.peer_address,
            duration=self.config.admission_lease_seconds,
        )

        def tenure() -> int | None:
            return lease.tenure if lease.holds() else None

        admitter = Admitter(
            self.config,
            self._svc,
            self.metrics,
            self.sink,
            EpochPool(
                lambda *a: admitter.issue(*a),
                size=self.config.epoch_pool_size,
                max_age=self.config.epoch_pool_max_age,
            ),
            tenure,
        )
        self.metrics.lease_held.set_function(lambda: float(lease.holds()))
        self.metrics.pooled.set_function(lambda: float(admitter.pool.pooled()))
        self.metrics.follow_pool_waits(lambda: admitter.pool.waits)
        relay = aiohttp.ClientSession()

        async def handle(request: web.Request) -> web.Response:
            return await self._answer(admitter, relay, request)

        app = web.Application(client_max_size=MAX_REVIEW_BYTES)
        app.router.add_post(WEBHOOK_PATH, handle)
        runner = web.AppRunner(
            app, handle_signals=False, access_log=None, shutdown_timeout=DRAIN_SECONDS
        )
        await runner.setup()
        rounds: asyncio.Task[None] | None = None
        try:
            for host, port, shared in self._addresses():
                site = web.TCPSite(
                    runner,
                    host,
                    port,
                    ssl_context=context,
                    reuse_address=True,
                    reuse_port=shared or None,
                )
                await site.start()
            log.info(
                "webhook serving https://%s:%d%s (relayed admissions at %s)",
                self.serving.listen,
                self.serving.port,
                WEBHOOK_PATH,
                self.serving.peer_address,
            )
            self._fingerprint = _fingerprint(self.serving.cert)
            rounds = asyncio.create_task(lease.run(), name="mcp-epoch-admission-lease")
            self._ready.set()
            reload = asyncio.create_task(self._follow_certificate(context))
            await self._stopping.wait()
            reload.cancel()
        finally:
            if rounds is not None:
                rounds.cancel()
                await asyncio.gather(rounds, return_exceptions=True)
            await lease.release()
            await runner.cleanup()
            await relay.close()
            await self._svc.aclose()
            await kube.aclose()

    def _addresses(self) -> list[tuple[str, int, bool]]:
        """(host, port, shared) to listen on: the webhook's address, and the peer address
        too when the listen address does not cover it (a shared port on loopback)."""
        out = [(self.serving.listen, self.serving.port, self.serving.share_port)]
        host, _, port = self.serving.peer_address.rpartition(":")
        host = host.strip("[]")
        covered = self.serving.listen in ("0.0.0.0", "::", host) and (
            int(port) == self.serving.port
        )
        if not covered:
            out.append((host, int(port), False))
        return out

    async def _follow_certificate(self, context: ssl.SSLContext) -> None:
        """Load a rotated certificate into the live context (new connections present it).

        The pair is tried on a scratch context first, so a half-written rotation (a new
        certificate beside the old key) keeps the working pair instead of breaking it.
        """
        files = (self.serving.cert, self.serving.key)
        stamp = _files_stamp(*files)
        while True:
            await asyncio.sleep(CERT_CHECK_SECONDS)
            try:
                now = _files_stamp(*files)
                if now == stamp:
                    continue
                self._tls()  # raises if the new pair does not load
                context.load_cert_chain(*files)
                self._fingerprint = _fingerprint(self.serving.cert)
            except (OSError, ssl.SSLError) as exc:
                log.error(
                    "webhook certificate %s changed but cannot be loaded (%s); still serving "
                    "the previous one: check the webhook TLS Secret",
                    self.serving.cert,
                    exc,
                )
                continue
            stamp = now
            log.warning("webhook certificate %s reloaded", self.serving.cert)

    async def _answer(
        self, admitter: Admitter, relay: aiohttp.ClientSession, request: web.Request
    ) -> web.Response:
        began = time.perf_counter()
        raw = await request.read()
        try:
            review = json.loads(raw)
        except ValueError as exc:  # bad JSON or not UTF-8
            return _bad_review(f"the body is not JSON ({exc})")
        if not isinstance(review, dict) or not isinstance(review.get("request"), dict):
            return _bad_review("the body is not an AdmissionReview with a request")
        uid = review["request"].get("uid")
        if not isinstance(uid, str) or not uid:
            return _bad_review("the AdmissionReview request has no uid")
        relayed = RELAYED_HEADER in request.headers
        deadline = time.monotonic() + HOLDER_WAIT_SECONDS
        while True:
            try:
                verdict = await admitter.admit(review["request"])
            except PoolUnavailable:
                pass
            except Exception:
                log.exception("admission of request %s failed: refusing the pod", uid[:64])
                verdict = refused(
                    500,
                    "mcp-epoch: the operator failed while admitting this pod, so it is refused "
                    "rather than run without an epoch (an operator bug: see its log, report "
                    "it, and retry the create)",
                )
                break
            else:
                break
            remaining = deadline - time.monotonic()
            if relayed or remaining <= 0:
                verdict = refused(
                    503,
                    "mcp-epoch: no operator process could hand out an epoch for this pod in "
                    "time (the admission lease is moving between operator replicas; its owner "
                    "retries the create, and `kubectl -n "
                    f"{self.config.operator_namespace} get lease "
                    f"{self.config.admission_lease}` shows the holder)",
                )
                if not relayed:
                    self.metrics.forwarded.labels("unreachable").inc()
                break
            answer = await self._relay(relay, raw, remaining)
            if answer is not None:
                self.metrics.forwarded.labels("relayed").inc()
                return answer
        self.metrics.admission(verdict.outcome, began)
        return web.json_response(review_response(uid, verdict))

    async def _relay(
        self, relay: aiohttp.ClientSession, raw: bytes, remaining: float
    ) -> web.Response | None:
        """The holder's answer to the review, or None (after waiting for the lease to move)
        when there is no holder to ask or it cannot be reached."""
        lease = self.lease
        assert lease is not None
        address = lease.holder_address
        if address is None or address == lease.address:
            await lease.changed(min(remaining, lease.every))
            return None
        try:
            async with relay.post(
                f"https://{address}{WEBHOOK_PATH}",
                data=raw,
                headers={RELAYED_HEADER: self.identity, "Content-Type": "application/json"},
                ssl=aiohttp.Fingerprint(self._fingerprint),
                timeout=aiohttp.ClientTimeout(total=remaining),
            ) as answer:
                body = await answer.read()
                if answer.status != 200:
                    raise aiohttp.ClientError(f"answered {answer.status}: {body[:200]!r}")
                return web.Response(body=body, status=200, content_type="application/json")
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            log.info("admission lease holder at %s not reached: %s", address, exc)
            await lease.changed(min(max(remaining - 0.1, 0.0), lease.every))
            return None


def _fingerprint(cert: Path) -> bytes:
    """The SHA-256 of the PEM certificate at ``cert`` (what a relay's TLS pins)."""
    return hashlib.sha256(ssl.PEM_cert_to_DER_cert(cert.read_text())).digest()
