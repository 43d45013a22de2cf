"""``subscriptions/listen`` streams (MCP 2026-07-28) end gracefully when this process drains.

A listen stream is a request whose response never ends on its own. Left open, a draining
replica's streams would hold its drain to the deadline and then drop, and their clients would
learn of it only from a dead connection. Instead, at the start of a drain every open stream
ends with the ``SubscriptionsListenResult`` the revision defines for a deliberate close (the
SDK's ``ListenHandler.close``), and a listen that arrives while draining gets that result at
once: its client re-listens, and the balancer sends it to a replica that stays.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger("mcp_epoch")

METHOD = "subscriptions/listen"


def end_listens_on_drain(server: Any, draining: Callable[[], bool]) -> Callable[[], None] | None:
    """Wrap the server's listen handler; returns what ends the open streams (None: the server
    serves no listen streams, or is not on an SDK that has them)."""
    low = getattr(server, "_lowlevel_server", server)  # MCPServer wraps a low-level Server
    lookup = getattr(low, "get_request_handler", None)
    entry = lookup(METHOD) if callable(lookup) else None
    if entry is None:
        return None
    from mcp.shared.subscriptions import SUBSCRIPTION_ID_META_KEY
    from mcp_types import SubscriptionsListenResult

    inner = entry.handler

    async def listen(ctx: Any, params: Any) -> Any:
        if draining():
            return SubscriptionsListenResult(_meta={SUBSCRIPTION_ID_META_KEY: ctx.request_id})
        return await inner(ctx, params)

    low.add_request_handler(METHOD, entry.params_type, listen)
    close = getattr(inner, "close", None)
    if not callable(close):
        return None

    def end_open_streams() -> None:
        close()
        log.info("draining: listen streams ended; their clients listen again elsewhere")

    return end_open_streams
