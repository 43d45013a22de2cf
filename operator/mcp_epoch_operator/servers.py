"""The servers the operator knows, remembered in its ConfigMap.

The ledger lists epochs per server only, so after a restart the operator must know which
servers to resync even when nothing of a server is left in the cluster (a bare pod or a plain
Deployment deleted while the operator was down). Each server is one key ``<ns>.<server>`` of
the ConfigMap (both are DNS labels: no dots, so the key is unambiguous).
"""

from __future__ import annotations

import logging

from mcp_epoch_operator.config import OperatorConfig
from mcp_epoch_operator.kube import KubeClient, KubeError

log = logging.getLogger("mcp_epoch_operator")
Key = tuple[str, str]


class ServersRecord:
    def __init__(self, kube: KubeClient, config: OperatorConfig) -> None:
        self.kube = kube
        self.namespace = config.operator_namespace
        self.name = config.servers_configmap
        self.watched = config.namespaces

    async def record(self, key: Key, present: bool) -> None:
        """Remember (or forget) a server; the ConfigMap is created when missing."""
        item = f"{key[0]}.{key[1]}"
        try:
            await self.kube.patch_configmap(
                self.namespace, self.name, {"data": {item: "" if present else None}}
            )
        except KubeError as exc:
            if exc.status != 404 or not present:
                log.info("could not record server %s/%s: %s", *key, exc)
                return
            body = {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {
                    "name": self.name,
                    "namespace": self.namespace,
                    "labels": {"app.kubernetes.io/managed-by": "mcp-epoch-operator"},
                },
                "data": {item: ""},
            }
            try:
                await self.kube.create_configmap(self.namespace, body)
            except KubeError as again:
                if again.status == 409:  # another replica created it meanwhile
                    await self.record(key, present)
                else:
                    log.info("could not record server %s/%s: %s", *key, again)

    async def recorded(self) -> set[Key]:
        try:
            cm = await self.kube.get_configmap(self.namespace, self.name)
        except KubeError as exc:
            log.info("could not read the servers ConfigMap: %s", exc)
            return set()
        keys: set[Key] = set()
        for item in (cm or {}).get("data") or {}:
            ns, _, server = item.partition(".")
            if ns and server and (self.watched is None or ns in self.watched):
                keys.add((ns, server))
        return keys
