"""Which MCP session an event belongs to.

The SDK shares one ``EventStore`` across all sessions and names streams by JSON-RPC request id
(``"1"``, ``"2"``, ... and ``"_GET_stream"``), so stream ids collide between sessions and
``store_event`` is not told the session. The guard therefore sets a context variable holding a
:class:`SessionTag` around every request. The SDK starts a session's message router from the
request that opened the session, so the router task inherits the tag of that request; the guard
learns the session id from the ``mcp-session-id`` response header and fills it into the same
tag, and later requests of the session look the tag up by id. Identity of the tag is the owner.
Tags are held weakly by the registry and strongly by the session's tasks and buffered events,
so the registry's memory ends with the session and its events.
"""

from __future__ import annotations

import weakref
from contextvars import ContextVar


class SessionTag:
    """Owner of events; equality is identity. ``session_id`` is filled in once known."""

    __slots__ = ("__weakref__", "session_id")

    def __init__(self, session_id: str | None = None) -> None:
        self.session_id = session_id

    def __repr__(self) -> str:
        return f"SessionTag({self.session_id!r})"


current_session: ContextVar[SessionTag | None] = ContextVar("epochsvc_session", default=None)


class SessionRegistry:
    """session id → tag, weakly: no entry outlives its session's tasks and buffered events."""

    def __init__(self) -> None:
        self._tags: weakref.WeakValueDictionary[str, SessionTag] = weakref.WeakValueDictionary()

    def get(self, session_id: str) -> SessionTag | None:
        return self._tags.get(session_id)

    def bind(self, session_id: str, tag: SessionTag) -> None:
        tag.session_id = session_id
        self._tags[session_id] = tag

    def __len__(self) -> int:
        return len(self._tags)
