"""Which MCP session an event belongs to, and what a session is beyond its events.

The SDK shares one ``EventStore`` across all sessions and names streams by JSON-RPC request id
(``"1"``, ``"2"``, ... and ``"_GET_stream"``), so stream ids collide between sessions and
``store_event`` is not told the session. The guard therefore sets a context variable holding a
:class:`SessionTag` around every request. The SDK starts a session's message router from the
request that opened the session, so the router task inherits the tag of that request; the guard
learns the session id from the ``mcp-session-id`` response header and fills it into the same
tag, and later requests of the session look the tag up by id. Identity of the tag is the owner.
Tags are held weakly by the registry and strongly by the session's tasks and buffered events,
so the registry's memory ends with the session and its events.

A tag also keeps what a handoff moves (:mod:`mcp_epoch._internal.handover`): the request that
opened the session, the protocol version and log level its client set, and the tails of
streams that earlier owners handed over with it.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from contextvars import ContextVar
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mcp_epoch._internal.handover import Tail
    from mcp_epoch.contract import ProcessEpoch


class SessionTag:
    """Owner of events; equality is identity. ``session_id`` is the SDK's own (local) ID, filled
    in once known; ``public_id`` is the ID its client holds (``<minting epoch>_<SDK id>``),
    which stays the same when the session moves to another process."""

    __slots__ = (
        "__weakref__",
        "ending",
        "host",
        "initialize",
        "log_level",
        "moved_to",
        "path",
        "protocol_version",
        "public_id",
        "session_id",
        "tails",
    )

    def __init__(self, session_id: str | None = None) -> None:
        self.session_id = session_id
        self.public_id: str | None = None
        #: The client's ``initialize`` request (its body), the path and ``Host`` it was sent to.
        self.initialize: bytes | None = None
        self.path = ""
        self.host: str | None = None
        self.protocol_version: str | None = None
        self.log_level: str | None = None
        #: Tails of earlier owners' streams, handed over with the session (oldest owner first).
        self.tails: tuple[Tail, ...] = ()
        #: Set once this process handed the session on: the process that holds it now.
        self.moved_to: ProcessEpoch | None = None
        #: Set when a drain that ran out of time ends the session: its streams are cut.
        self.ending = False

    def __repr__(self) -> str:
        return f"SessionTag({self.session_id!r})"


current_session: ContextVar[SessionTag | None] = ContextVar("epochsvc_session", default=None)


class SessionRegistry:
    """Session ID → tag, by the SDK's local ID and by the ID clients hold, weakly: no entry
    outlives its session's tasks and buffered events."""

    def __init__(self) -> None:
        self._tags: weakref.WeakValueDictionary[str, SessionTag] = weakref.WeakValueDictionary()
        self._public: weakref.WeakValueDictionary[str, SessionTag] = weakref.WeakValueDictionary()
        #: Called with the app's own ID of every session bound here (an adapter's hook).
        self.opened: Callable[[str], None] | None = None

    def get(self, session_id: str) -> SessionTag | None:
        return self._tags.get(session_id)

    def held(self, public_id: str) -> SessionTag | None:
        """The session a client names by ``public_id``, if this process holds it."""
        return self._public.get(public_id)

    def bind(self, session_id: str, tag: SessionTag, public_id: str | None = None) -> None:
        tag.session_id = session_id
        self._tags[session_id] = tag
        if public_id is not None:
            tag.public_id = public_id
            self._public[public_id] = tag
        if self.opened is not None:
            self.opened(session_id)

    def tags(self) -> list[SessionTag]:
        """Every session this process holds now."""
        return list(self._tags.values())

    def __len__(self) -> int:
        return len(self._tags)
