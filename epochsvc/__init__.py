"""mcp-epoch: epoch-safe Last-Event-ID resumption for MCP servers on Kubernetes.

`epochsvc.tokens` and `epochsvc.replica` are importable with only the core dependencies;
the epoch service (`epochsvc.service`) needs the `service` extra.
"""

__version__ = "0.1.0"
