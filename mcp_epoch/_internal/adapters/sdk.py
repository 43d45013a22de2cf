"""The SDK adapter: ``epoch_safe_app(server)``, a Python SDK server's app on the core, in one call.

The SDK writes its events through the core's ``EventStore`` and serves resumptions from it, so
this adapter builds the server's own Streamable HTTP app on that store, ends the server's
``subscriptions/listen`` streams when a drain begins, and has the SDK write each event from the
text the store keeps (:func:`writes_stored_text`). This module imports ``mcp`` (and
``sse-starlette``, the SDK's own SSE layer).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any, Protocol

from mcp.server.streamable_http import EventMessage
from sse_starlette.event import ensure_bytes
from sse_starlette.sse import EventSourceResponse

from mcp_epoch._internal.app import EpochSafeApp
from mcp_epoch._internal.listen import end_listens_on_drain
from mcp_epoch._internal.sessions import SessionRegistry
from mcp_epoch._internal.store import EpochEventStore, RawMessage

#: Options that are the core's, not ``streamable_http_app``'s.
_CORE_OPTIONS = ("env", "first_sync_timeout")


class StreamableServer(Protocol):
    """What the SDK's ``MCPServer`` and low-level ``Server`` both offer."""

    @property
    def streamable_http_app(self) -> Callable[..., Any]: ...


class StoredText(Protocol):
    def stored_text(self, event_id: str) -> str | None: ...


def epoch_safe_app(server: StreamableServer, **options: Any) -> EpochSafeApp:
    """``app = epoch_safe_app(mcp)``: the SDK server's Streamable HTTP app, epoch-safe.

    ``options`` go to ``server.streamable_http_app`` (``retry_interval``, ``json_response``,
    ...), except ``env`` (default ``os.environ``: the variables the operator injects) and
    ``first_sync_timeout``.
    """
    core = {k: options.pop(k) for k in _CORE_OPTIONS if k in options}

    def inner(store: EpochEventStore, sessions: SessionRegistry) -> Any:
        app = server.streamable_http_app(event_store=store, **options)
        manager = getattr(server, "session_manager", None)
        if manager is not None:
            sessions.opened = writes_stored_text(manager, store)
        return app

    return EpochSafeApp(
        inner,
        on_drain=lambda draining: end_listens_on_drain(server, draining),
        **core,
    )


def writes_stored_text(manager: Any, store: StoredText) -> Callable[[str], None]:
    """A hook for ``SessionRegistry.opened``: the SDK transport of the session that opened
    writes each event the store holds as an SSE chunk made from the store's text, so each
    message is serialized once, not once for the ring and again for the wire.

    The store keeps every message as the JSON text it is sent as (one string the collector
    never walks). The SDK's writer then serialized the same model again, the dearer of the two
    (counted by ``python -m bench guard --instructions``: 15.7 k instructions a message, the
    store's 9.1 k), into a dict that sse-starlette turns into a ``ServerSentEvent`` and then
    into bytes (4 us an event in Python). The SDK builds each event in its transport's
    ``_create_event_data``, and sse-starlette sends bytes as they are; the hook, set on that
    one transport (never on the class), returns the chunk itself, so the wire carries the very
    text a resumption replays. An event the ring no longer holds is built by the SDK from its
    model, as before.

    What it reaches for is private in the SDK (the session manager's table of transports, the
    transport's method): the hook is set only where both are there and the method's event,
    encoded by sse-starlette, is byte for byte the chunk the hook makes, checked with a probe.
    Any other SDK is served as it always was.
    """
    text_of = store.stored_text
    verdicts: dict[type, bool] = {}  # per transport class: do its events encode as ours?

    def opened(local: str) -> None:
        transports = getattr(manager, "_server_instances", None)
        transport = transports.get(local) if isinstance(transports, dict) else None
        make = getattr(transport, "_create_event_data", None)
        if make is None or getattr(make, "writes_stored_text", False):
            return
        cls = type(transport)
        if cls not in verdicts:
            verdicts[cls] = _encodes_as_chunk(make)
        if not verdicts[cls]:
            return
        # Weakly: the hook is the transport's own attribute, and a strong reference back to
        # it would keep each ended session's transport for the cyclic collector.
        sdk_own = weakref.WeakMethod(make)

        def create_event_data(event: EventMessage) -> Any:
            event_id = event.event_id
            text = text_of(event_id) if event_id else None
            # (JSON text has no line break: one data line carries it.)
            if event_id and text is not None and "\n" not in text and "\r" not in text:
                return sse_chunk(event_id, text)
            own = sdk_own()  # alive: the hook is called as its own transport's attribute
            assert own is not None
            return own(event)

        create_event_data.writes_stored_text = True  # type: ignore[attr-defined]
        transport._create_event_data = create_event_data  # type: ignore[union-attr]

    return opened


#: What sse-starlette ends each line with where the SDK's responses do not say (they do not).
_SEP = EventSourceResponse.DEFAULT_SEPARATOR
_EVENT = f"{_SEP}event: message{_SEP}data: "
_END = _SEP + _SEP


def sse_chunk(event_id: str, text: str) -> bytes:
    """One SSE event, as sse-starlette encodes the SDK's events: ID, type, one data line."""
    return ("id: " + event_id + _EVENT + text + _END).encode()


def _encodes_as_chunk(make: Callable[[EventMessage], Any]) -> bool:
    """Whether the SDK's ``_create_event_data``, for a message whose JSON is known, makes an
    event sse-starlette encodes to exactly :func:`sse_chunk`'s bytes."""
    text, event_id = '{"probe":"\u00e9"}', "probe:1"
    try:
        built = make(EventMessage(RawMessage(text, False), event_id))  # type: ignore[arg-type]
        return bool(ensure_bytes(built, _SEP) == sse_chunk(event_id, text))
    except Exception:  # any failure: not the SDK this was made for
        return False
