"""Private: the library's internals. Import from :mod:`mcp_epoch` instead."""
