"""The handoff, receiving side: take the sessions a draining peer hands this process.

A hand-on (``POST`` :data:`~mcp_epoch.contract.HANDOFF_PATH`) is taken only from the process
the ledger's handoff rule names as handing to *this* process, and only from that process's own
pod address; anything else is refused (403), so no one can plant a session here.

Each session is rebuilt in this process's SDK app through the SDK's public HTTP surface, as its
client once built it: the client's own ``initialize`` request, then
``notifications/initialized``, then ``logging/setLevel`` if the client had set a level. The SDK
mints a new local session ID for it; the client keeps the one it holds, which the guard maps to
the new local one. No private SDK internals are touched, so this works for any Streamable HTTP
app. What a tool kept in the old process's memory does not move.

Cursors of the earlier owners are then served from the tails handed over with the session
(:func:`mcp_epoch._internal.decision.decide_handed`), under their original IDs.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Final

from mcp_epoch._internal import handover, inprocess
from mcp_epoch._internal.body import BodyTooLarge, read_body
from mcp_epoch._internal.guard import (
    SESSION_HEADER,
    ASGIApp,
    Receive,
    Scope,
    Send,
    WaitView,
    error_body,
    respond,
)
from mcp_epoch._internal.handover import HandedSession
from mcp_epoch._internal.sessions import SessionRegistry, SessionTag, current_session
from mcp_epoch._internal.snapshot import EpochSnapshot
from mcp_epoch._internal.upstream import host_port
from mcp_epoch.contract import HANDOFF_FROM_HEADER, ProcessEpoch

log = logging.getLogger(__name__)

#: How long a hand-on waits for this process's copy of the ledger to show the sender's rule
#: (the sender records it just before it sends).
RULE_WAIT: Final = 5.0


class AdoptFailed(Exception):
    """The SDK app would not rebuild the session (it stays with its old owner)."""


def refusal(
    view: EpochSnapshot, sender: ProcessEpoch, own: ProcessEpoch, peer_host: str | None
) -> str | None:
    """Why a hand-on from ``sender`` (arriving from ``peer_host``) is refused, or None: the
    ledger must record that ``sender`` hands its sessions to ``own``, and the request must come
    from the sender's own address."""
    rec = view.epochs.get(str(sender.pod))
    if rec is None or rec.successor != str(own) or rec.successor_of != sender.incarnation:
        return f"the ledger does not say that {sender} hands its sessions to {own}"
    if rec.address is None or peer_host is None:
        return f"the ledger has no address for {sender}"
    try:
        host = host_port(rec.address)[0]
    except ValueError:
        return f"the ledger's address for {sender} is malformed"
    if host != peer_host:
        return f"the hand-on did not come from {sender}'s address"
    return None


class Adopter:
    """Serves :data:`~mcp_epoch.contract.HANDOFF_PATH` for an adapter."""

    def __init__(
        self,
        app: ASGIApp,
        registry: SessionRegistry,
        *,
        epoch: Callable[[], ProcessEpoch],
        snapshot: Callable[[], EpochSnapshot],
        wait_view: WaitView,
    ) -> None:
        self._app = app
        self._registry = registry
        self._epoch = epoch
        self._snapshot = snapshot
        self._wait_view = wait_view
        #: Sessions this process took from draining peers, since start.
        self.adopted = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("method") != "POST":
            await respond(send, 405, error_body("a hand-on is a POST"), [(b"allow", b"POST")])
            return
        try:
            body, early = await read_body(receive, handover.MAX_HANDOFF_BYTES)
        except BodyTooLarge as exc:
            await respond(send, 413, error_body(str(exc)))
            return
        if early is not None:
            return
        try:
            sender, sessions = handover.decode(body)
        except ValueError as exc:
            await respond(send, 422, error_body(f"malformed hand-on: {exc}"))
            return
        named = dict(scope["headers"]).get(HANDOFF_FROM_HEADER.encode())
        if named is None or bytes(named).decode("latin-1") != str(sender):
            await respond(send, 400, error_body(f"{HANDOFF_FROM_HEADER} must name the sender"))
            return
        client = scope.get("client")
        peer = str(client[0]) if client else None
        own = self._epoch()
        why = refusal(self._snapshot(), sender, own, peer)
        if why is not None and await self._wait_view(
            lambda view: refusal(view, sender, own, peer) is None, RULE_WAIT
        ):
            why = None
        if why is not None:
            log.warning("refused a hand-on from %s: %s", sender, why)
            await respond(send, 403, error_body(f"hand-on refused: {why}"))
            return
        adopted: list[str] = []
        refused: dict[str, str] = {}
        for session in sessions:
            if self._registry.held(session.public_id) is not None:
                adopted.append(session.public_id)  # a repeat of a hand-on that was answered
                continue
            try:
                await self._rebuild(scope, session)
            except AdoptFailed as exc:
                refused[session.public_id] = str(exc)
                continue
            adopted.append(session.public_id)
            self.adopted += 1
        if refused:
            log.warning("took %d sessions from %s, refused %d", len(adopted), sender, len(refused))
        else:
            log.info("took %d sessions from %s", len(adopted), sender)
        body = handover.encode_answer(adopted, refused)
        await respond(send, 200, body)

    async def _rebuild(self, scope: Scope, session: HandedSession) -> None:
        """Open the session anew in the app as its client opened it (see :func:`reopen`)."""
        tag = SessionTag()
        tag.initialize = session.initialize
        tag.path = session.path
        tag.host = session.host
        tag.protocol_version = session.protocol_version
        tag.log_level = session.log_level
        tag.tails = session.tails
        await reopen(self._app, scope, tag, self._registry, session.public_id)


async def reopen(
    app: ASGIApp, base: Scope, tag: SessionTag, registry: SessionRegistry, public_id: str
) -> None:
    """Open a session anew in ``app`` as its client opened it, from what ``tag`` recorded:
    its ``initialize``, then ``notifications/initialized``, then ``logging/setLevel`` if the
    client had set a level. The app mints a new local ID, bound to the ``public_id`` the client
    holds. It runs under ``tag``, which the session's router task inherits (the store files
    its events under it). Used for a session handed over by a draining peer, and by the
    sidecar for a session its upstream lost when it restarted. Raises :class:`AdoptFailed`."""
    if tag.initialize is None:
        raise AdoptFailed("its initialize request was not recorded")
    initialize = tag.initialize
    token = current_session.set(tag)
    try:
        status, headers, _ = await _request(app, base, tag, initialize, None)
        local = headers.get(SESSION_HEADER)
        if status != 200 or local is None:
            raise AdoptFailed(f"initialize answered {status}")
        local_id = local.decode("latin-1")
        registry.bind(local_id, tag, public_id)
        notified = b'{"jsonrpc":"2.0","method":"notifications/initialized"}'
        status, _, _ = await _request(app, base, tag, notified, local_id)
        if status >= 300:
            raise AdoptFailed(f"notifications/initialized answered {status}")
        if tag.log_level is not None:
            level = {
                "jsonrpc": "2.0",
                "id": "mcp-epoch-handoff",
                "method": "logging/setLevel",
                "params": {"level": tag.log_level},
            }
            status, _, _ = await _request(app, base, tag, json.dumps(level).encode(), local_id)
            if status >= 300:
                raise AdoptFailed(f"logging/setLevel answered {status}")
    finally:
        current_session.reset(token)


async def _request(
    app: ASGIApp, base: Scope, tag: SessionTag, body: bytes, local_id: str | None
) -> tuple[int, dict[bytes, bytes], bytes]:
    try:
        return await inprocess.request(
            app,
            base,
            "POST",
            tag.path,
            tag.host,
            body,
            local_id,
            tag.protocol_version if local_id is not None else None,
        )
    except TimeoutError:
        raise AdoptFailed("the app did not answer") from None
