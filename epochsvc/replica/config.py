"""The replica's environment, as injected by the operator (the names the operator injects)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from epochsvc.replica.buffer import capacity_from_env

ENV_EPOCH: Final = "MCP_EPOCH"
ENV_SERVICE_URL: Final = "MCP_EPOCH_SERVICE_URL"
ENV_SERVICE_TOKEN: Final = "MCP_EPOCH_SERVICE_TOKEN"
ENV_NAMESPACE: Final = "MCP_SERVER_NAMESPACE"
ENV_SERVER: Final = "MCP_SERVER_NAME"
ENV_POD_NAME: Final = "MCP_POD_NAME"
ENV_POD_UID: Final = "MCP_POD_UID"


def _get(env: Mapping[str, str], key: str) -> str | None:
    value = env.get(key)
    return value.strip() or None if value is not None else None


@dataclass(frozen=True, slots=True)
class ReplicaConfig:
    pod_epoch: str | None
    service_url: str | None
    service_token: str | None
    namespace: str | None
    server: str | None
    pod_name: str | None
    pod_uid: str | None
    buffer_events: int

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> ReplicaConfig:
        e = os.environ if env is None else env
        url = _get(e, ENV_SERVICE_URL)
        return cls(
            pod_epoch=_get(e, ENV_EPOCH),
            service_url=url.rstrip("/") if url else None,
            service_token=_get(e, ENV_SERVICE_TOKEN),
            namespace=_get(e, ENV_NAMESPACE),
            server=_get(e, ENV_SERVER),
            pod_name=_get(e, ENV_POD_NAME),
            pod_uid=_get(e, ENV_POD_UID),
            buffer_events=capacity_from_env(e),
        )

    def auth_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.service_token}"} if self.service_token else {}
