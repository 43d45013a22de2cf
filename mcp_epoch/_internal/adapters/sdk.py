"""The SDK adapter: ``epoch_safe_app(server)``, a Python SDK server's app on the core, in one call.

The SDK writes its events through the core's ``EventStore`` and serves resumptions from it, so
all this adapter does is build the server's own Streamable HTTP app on that store and end the
server's ``subscriptions/listen`` streams when a drain begins. This module imports ``mcp``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from mcp_epoch._internal.app import EpochSafeApp
from mcp_epoch._internal.listen import end_listens_on_drain

#: Options that are the core's, not ``streamable_http_app``'s.
_CORE_OPTIONS = ("env", "first_sync_timeout")


class StreamableServer(Protocol):
    """What the SDK's ``MCPServer`` and low-level ``Server`` both offer."""

    @property
    def streamable_http_app(self) -> Callable[..., Any]: ...


def epoch_safe_app(server: StreamableServer, **options: Any) -> EpochSafeApp:
    """``app = epoch_safe_app(mcp)``: the SDK server's Streamable HTTP app, epoch-safe.

    ``options`` go to ``server.streamable_http_app`` (``retry_interval``, ``json_response``,
    ...), except ``env`` (default ``os.environ``: the variables the operator injects) and
    ``first_sync_timeout``.
    """
    core = {k: options.pop(k) for k in _CORE_OPTIONS if k in options}
    return EpochSafeApp(
        lambda store, _sessions: server.streamable_http_app(event_store=store, **options),
        on_drain=lambda draining: end_listens_on_drain(server, draining),
        **core,
    )
