"""The epoch service (``epochsvc.service``, the ``service`` extra) and the demo.

The library MCP servers link is :mod:`mcp_epoch`; the names all parts share are in
:mod:`mcp_epoch.contract`.
"""
