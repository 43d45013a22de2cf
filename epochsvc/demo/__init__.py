"""``mcp-epoch demo``: the rolling-deploy proof (naive fleet vs mcp-epoch fleet, local processes).

Modules, one job each: :mod:`~epochsvc.demo.checker` (ground truth and checks, pure),
:mod:`~epochsvc.demo.replica` (the replica process of either fleet),
:mod:`~epochsvc.demo.naive_server` (the model of naive servers), :mod:`~epochsvc.demo.balancer`
(the round-robin balancer), :mod:`~epochsvc.demo.service` (the epoch service process),
:mod:`~epochsvc.demo.fleet` (fleet drivers: how replicas come and go),
:mod:`~epochsvc.demo.client` (the checked MCP clients), :mod:`~epochsvc.demo.scenario` (the
timeline), :mod:`~epochsvc.demo.report` (table and verdict), :mod:`~epochsvc.demo.cli`.
The same scenario on a (kwok) Kubernetes control plane is a test, not part of the product: its
fleet driver and pod runner live in ``tests/e2e/``.
"""
