"""The request-state key ring of this server, followed from the epoch service (MCP 2026-07-28).

The SDK seals a multi-round-trip request's ``requestState`` under a key only the sealing
process holds, unless told otherwise, so a client's retry that reaches another replica (or
this pod after a restart) is refused. :func:`request_state_security` gives the SDK a policy
whose codec holds the *server's* ring instead: every replica loads the same ring from the
epoch service, follows its rotation without a restart, and reports the ring revision it holds
(after switching, never before), which is what lets a rotation advance.

The codec is the SDK's own AES-GCM codec, rebuilt for each ring revision and swapped whole; a
refused state is refused the SDK's way (``InvalidRequestState``, hence -32602 on the wire) and
counted here by reason for ``/metrics``.
"""

from __future__ import annotations

import base64
import logging
import threading
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import httpx

from mcp_epoch import api
from mcp_epoch._internal.config import ReplicaConfig
from mcp_epoch.api_client import (
    EpochServiceError,
    EpochServiceUnavailable,
    SyncEpochServiceClient,
)
from mcp_epoch.contract import ProcessEpoch

if TYPE_CHECKING:
    from mcp.server.request_state import RequestStateSecurity

log = logging.getLogger("mcp_epoch.request_state")

#: The SDK's state TTL, until the ring says otherwise.
SDK_DEFAULT_TTL = 600.0
#: How long one long poll on the ring is held (the live view's own wait).
RING_WAIT_SECONDS = 25.0


@dataclass(frozen=True, slots=True)
class _Held:
    revision: int
    codec: object  # the SDK's AESGCMRequestStateCodec for this revision's keys


class RingCodec:
    """A ``RequestStateCodec`` over whichever ring revision this process holds now."""

    def __init__(self) -> None:
        self._held: _Held | None = None
        self.rejected: Counter[str] = Counter()
        self._lock = threading.Lock()
        # Held while sealing and while switching revisions: once install() returns, no seal
        # under the previous revision is still under way, so the report that follows is true.
        self._sealing = threading.Lock()

    @property
    def revision(self) -> int:
        """The ring revision in use (0: none loaded yet)."""
        held = self._held
        return held.revision if held else 0

    def install(self, revision: int, keys: list[bytes]) -> None:
        from mcp.server.request_state import AESGCMRequestStateCodec

        codec = AESGCMRequestStateCodec(keys)
        with self._sealing:
            self._held = _Held(revision, codec)

    def seal(self, payload: bytes) -> str:
        with self._sealing:
            held = self._held
            if held is None:  # the SDK answers a sanitized internal error: nothing sealed
                raise RuntimeError("no request-state ring loaded yet")
            return held.codec.seal(payload)  # type: ignore[attr-defined, no-any-return]

    def unseal(self, token: str) -> bytes:
        from mcp.server.request_state import InvalidRequestState

        held = self._held
        try:
            if held is None:
                raise InvalidRequestState("no ring loaded")
            return held.codec.unseal(token)  # type: ignore[attr-defined, no-any-return]
        except InvalidRequestState as exc:
            with self._lock:
                self.rejected[str(exc).replace(" ", "_")] += 1
            raise


class RingFollower:
    """Loads this server's ring, follows it in a daemon thread, reports what it holds."""

    def __init__(self, config: ReplicaConfig, codec: RingCodec) -> None:
        self.config = config
        self.codec = codec
        self.reported = 0  # the revision the service last accepted from this process
        self.last_error: str | None = None
        self._process: ProcessEpoch | None = None
        self._stop = threading.Event()
        self._loaded = threading.Event()
        self._thread: threading.Thread | None = None
        self._security: RequestStateSecurity | None = None

    @property
    def enabled(self) -> bool:
        c = self.config
        return bool(c.service_url and c.namespace and c.server)

    def bind(self, security: RequestStateSecurity) -> None:
        self._security = security

    def sync_once(self, client: SyncEpochServiceClient) -> None:
        """One look at the ring: switch to a new revision, then say so. When the report says
        the ring has moved on since (this process was the last one the step waited for, and
        the service took the step at its report), look again at once."""
        while self._sync(client):
            pass

    def follow_once(self, client: SyncEpochServiceClient, wait: float = RING_WAIT_SECONDS) -> bool:
        """Wait (a long poll, up to ``wait`` seconds) for a revision newer than the one held,
        then switch to it and say so. Whether the service held the poll: an older service
        answers at once, unchanged, and is then looked at only every refresh interval."""
        since = self.codec.revision
        began = time.monotonic()
        if self._sync(client, since, wait):
            self.sync_once(client)
        return self.codec.revision != since or time.monotonic() - began >= wait / 2

    def _sync(
        self, client: SyncEpochServiceClient, since: int | None = None, wait: float | None = None
    ) -> bool:
        """Load, switch, report; whether the ring is already newer than what was reported."""
        assert self.config.namespace and self.config.server
        ring = client.send(
            api.request_state_ring(self.config.namespace, self.config.server, since, wait)
        )
        if ring.revision != self.codec.revision:
            keys = [base64.b64decode(k) for k in ring.keys]
            self.codec.install(ring.revision, keys)
            if self._security is not None:
                self._security.ttl = ring.ttl_seconds
            log.info(
                "request-state ring loaded",
                extra={"revision": ring.revision, "phase": ring.phase, "keys": len(keys)},
            )
        self._loaded.set()
        process = self._process
        if process is None or self.reported == ring.revision:
            return False
        held = client.send(api.report_ring(str(process), ring.revision))
        self.reported = ring.revision
        return held.current_revision > ring.revision

    def start(self, process: ProcessEpoch | None, registered: bool) -> None:
        """Follow from now on; ``process`` reports only if the ledger issued it."""
        if self._thread is not None or not self.enabled:
            return
        self.attach(process, registered)
        self._thread = threading.Thread(
            target=self._run, args=(self._stop,), name="mcp-epoch-ring", daemon=True
        )
        self._thread.start()

    def attach(self, process: ProcessEpoch | None, registered: bool) -> None:
        """The process that reports what it holds (only one the ledger issued can)."""
        self._process = process if registered else None
        if not registered:
            log.error(
                "this process has a fallback epoch: it loads the request-state ring but cannot "
                "report what it holds, so a rotation of %s/%s waits for it until it restarts",
                self.config.namespace,
                self.config.server,
            )

    def wait_loaded(self, timeout: float) -> bool:
        return self._loaded.wait(timeout)

    @property
    def loaded(self) -> bool:
        return self._loaded.is_set()

    def _run(self, stop: threading.Event) -> None:
        assert self.config.service_url
        timeout = httpx.Timeout(10.0, read=RING_WAIT_SECONDS + 10.0)
        with SyncEpochServiceClient(
            self.config.service_url, self.config.credential, timeout=timeout
        ) as client:
            while not stop.is_set():
                pause = self.config.ring_refresh_seconds
                try:
                    if not self._loaded.is_set():
                        self.sync_once(client)
                        pause = 0.0  # loaded: follow from now on
                    elif self.follow_once(client):
                        pause = 0.0  # held until a change or its wait's end: poll again
                    self.last_error = None
                except (EpochServiceError, EpochServiceUnavailable, ValueError) as exc:
                    if self.last_error is None:
                        log.error(
                            "cannot follow the request-state ring (%s); keeping revision %d",
                            exc,
                            self.codec.revision,
                        )
                    self.last_error = str(exc)
                # Not loaded yet (a failure): try again soon. A failure once loaded, or a
                # service that does not hold the poll: the next look after ``refresh``.
                stop.wait(pause if self._loaded.is_set() else 0.5)

    def stop(self, timeout: float = 0.2) -> None:
        """Stop following. A long poll under way is not waited for beyond ``timeout`` (a
        process draining must not wait out a poll's 25 s): the thread is a daemon, and ends
        at its poll's answer, its own stop event set."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        self._stop = threading.Event()  # the next start()'s

    def metrics(self) -> list[str]:
        lines = [
            "# HELP mcp_epoch_request_state_ring_revision The request-state ring revision "
            "this process seals and opens with (0: none loaded).",
            "# TYPE mcp_epoch_request_state_ring_revision gauge",
            f"mcp_epoch_request_state_ring_revision {self.codec.revision}",
            "# HELP mcp_epoch_request_state_rejected_total requestState tokens refused by "
            "the ring, by reason.",
            "# TYPE mcp_epoch_request_state_rejected_total counter",
        ]
        for reason in sorted({"unknown_key", "malformed", "seal", *self.codec.rejected}):
            count = self.codec.rejected.get(reason, 0)
            lines.append(f'mcp_epoch_request_state_rejected_total{{reason="{reason}"}} {count}')
        return lines


_FOLLOWER: RingFollower | None = None
_SECURITY: RequestStateSecurity | None = None
_GUARD = threading.Lock()


def follower() -> RingFollower | None:
    """This process's ring follower, if :func:`request_state_security` made one."""
    return _FOLLOWER


def request_state_security(env: Mapping[str, str] | None = None) -> RequestStateSecurity:
    """``MCPServer(name, request_state_security=mcp_epoch.request_state_security())``.

    The SDK policy whose keys are this server's ring in the epoch service, shared by every
    replica and rotated by the operator. :func:`~mcp_epoch.epoch_safe_app` loads the ring
    before the server reports ready. One per process: later calls return the same policy.
    Without an epoch service in the environment it is the SDK's ephemeral policy (one process,
    one key), and says so."""
    global _FOLLOWER, _SECURITY
    from mcp.server.request_state import RequestStateSecurity

    with _GUARD:
        if _SECURITY is not None:
            return _SECURITY
        config = ReplicaConfig.from_env(env)
        ring = RingFollower(config, RingCodec())
        if not ring.enabled:
            log.warning(
                "no epoch service in the environment: requestState is sealed under a key of "
                "this process only; a retry that reaches another replica is refused"
            )
            _SECURITY = RequestStateSecurity.ephemeral()
            return _SECURITY
        security = RequestStateSecurity(codec=ring.codec, ttl=SDK_DEFAULT_TTL)
        ring.bind(security)
        _FOLLOWER, _SECURITY = ring, security
        return security


__all__ = ["RingCodec", "RingFollower", "follower", "request_state_security"]
