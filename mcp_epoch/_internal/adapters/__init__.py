"""The data plane's two adapters over its one core (:mod:`mcp_epoch._internal.app`).

Each only translates: :mod:`.sdk` hands the core's event store to a server on the MCP Python
SDK, and :mod:`.sidecar` relays to any Streamable HTTP server on ``localhost`` and files its
events in that store. No decision (IDs, buffer, resume, forward, drain, handoff) lives here;
import-linter keeps the core from importing either adapter.
"""
