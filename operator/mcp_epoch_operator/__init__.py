"""The mcp-epoch Kubernetes operator: ``McpServer`` → Deployment + Service, the epoch-injecting
mutating admission webhook, and pod lifecycle → epoch lifecycle.

Most modules are pure (``resources``, ``webhook``, ``lifecycle``, ``resync``, ``status``) so tests
call them without a cluster; ``handlers`` wires them to kopf and ``cli`` is the entry point.
Nothing here imports kopf at import time except ``handlers``.
"""
