"""``mcp-epoch demo``: the rolling-deploy proof (naive fleet vs mcp-epoch fleet, local processes).

Modules, one job each: :mod:`~epochsvc.demo.checker` (ground truth and checks, pure),
:mod:`~epochsvc.demo.replica` (the replica process of either fleet),
:mod:`~epochsvc.demo.naive_server` (the model of naive servers), :mod:`~epochsvc.demo.proxy`
(the round-robin balancer), :mod:`~epochsvc.demo.service` (the epoch service process),
:mod:`~epochsvc.demo.fleet` (fleet drivers: how replicas come and go),
:mod:`~epochsvc.demo.client` (the checked MCP clients), :mod:`~epochsvc.demo.scenario` (the
timeline), :mod:`~epochsvc.demo.report` (table and verdict), :mod:`~epochsvc.demo.cli`.
On a (kwok) Kubernetes control plane: :mod:`~epochsvc.demo.kube_fleet` (the fleet as an
``McpServer`` and a real ``kubectl rollout restart``) and :mod:`~epochsvc.demo.podrunner` (a
local process per Running pod, with the pod's environment).
"""
