"""mcp-epoch: epoch-safe ``Last-Event-ID`` resumption for MCP servers on Kubernetes.

A server on the official MCP Python SDK adopts it in one line::

    app = mcp_epoch.epoch_safe_app(mcp)  # serve `app` instead of mcp.streamable_http_app()

served with :func:`serve` (uvicorn, draining on SIGTERM), and a client that wants rejections
handled for it uses :class:`EpochClient`. A server in any other language, or one nobody may
change, gets the same from the sidecar, ``mcp-epoch proxy`` (:func:`sidecar_app`). On MCP
2026-07-28, a multi-round-trip request's state opens on every replica with one more line:
``MCPServer(name, request_state_security=mcp_epoch.request_state_security())``. The names every
part agrees on (environment, labels, states, token formats) are in :mod:`mcp_epoch.contract`,
the epoch service's API (its bodies and calls) in :mod:`mcp_epoch.api`, and the one client of
that API in :mod:`mcp_epoch.api_client`. Everything else is private. ``import mcp_epoch`` needs
only ``httpx``, ``anyio`` and ``pydantic``; the names that need the ``mcp`` extra load on first
use.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

from mcp_epoch._internal.errors import ResumptionRejected
from mcp_epoch.contract import Reason

if TYPE_CHECKING:
    from mcp_epoch._internal.adapters.sdk import epoch_safe_app
    from mcp_epoch._internal.adapters.sidecar import sidecar_app
    from mcp_epoch._internal.app import EpochSafeApp
    from mcp_epoch._internal.client import EpochClient
    from mcp_epoch._internal.keyring import request_state_security
    from mcp_epoch._internal.serve import serve

try:
    __version__ = version("mcp-epoch")
except PackageNotFoundError:  # pragma: no cover - a source tree that was never installed
    __version__ = "0+unknown"

__all__ = [
    "EpochClient",
    "EpochSafeApp",
    "Reason",
    "ResumptionRejected",
    "epoch_safe_app",
    "request_state_security",
    "serve",
    "sidecar_app",
]

_LAZY = {
    "EpochSafeApp": "mcp_epoch._internal.app",
    "epoch_safe_app": "mcp_epoch._internal.adapters.sdk",
    "EpochClient": "mcp_epoch._internal.client",
    "serve": "mcp_epoch._internal.serve",
    "request_state_security": "mcp_epoch._internal.keyring",
    "sidecar_app": "mcp_epoch._internal.adapters.sidecar",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'mcp_epoch' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
