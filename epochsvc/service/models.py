"""Pydantic models for every request and response body of the v1 API."""

from __future__ import annotations

from typing import Annotated, Any, Self

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from epochsvc.service.lifecycle import State
from epochsvc.service.store.base import EpochRecord
from mcp_epoch.contract import DNS1123_LABEL_PATTERN, UID_PATTERN

K8sName = Annotated[
    str, StringConstraints(pattern=rf"^{DNS1123_LABEL_PATTERN}$", min_length=1, max_length=63)
]
PodName = Annotated[
    str,
    StringConstraints(
        pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$",
        min_length=1,
        max_length=253,
    ),
]
Uid = Annotated[str, StringConstraints(pattern=rf"^{UID_PATTERN}$", max_length=128)]
# host:port of a pod: an IPv4 address or DNS name, or a bracketed IPv6 address; port 1-65535.
Address = Annotated[
    str,
    StringConstraints(
        pattern=r"^(\[[0-9A-Fa-f:.]{2,45}\]|[A-Za-z0-9]([-A-Za-z0-9.]{0,251}[A-Za-z0-9])?)"
        r":([1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])$",
        max_length=300,
    ),
]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class IssueRequest(_Strict):
    namespace: K8sName
    server: K8sName = Field(description="the McpServer (or labelled Deployment) name")
    request_uid: Uid = Field(description="the admission request UID; issuing is idempotent on it")


class BindRequest(_Strict):
    pod_name: PodName
    pod_uid: Uid
    address: Address | None = Field(
        default=None,
        description="where the pod serves (podIP:port, from the API server); a repeated bind "
        "of the same pod records it once the pod has an IP",
    )


class IncarnationRequest(_Strict):
    pod_name: PodName | None = None
    pod_uid: Uid | None = None


class Epoch(BaseModel):
    epoch: str
    generation: int
    namespace: str
    server: str
    state: State
    pod_name: str | None
    pod_uid: str | None
    incarnation: int | None = Field(description="the newest incarnation, or null")
    process_epoch: str | None = Field(description="the newest process epoch, or null")
    revision: int = Field(description="the ledger revision of this epoch's last change")
    address: str | None = Field(
        default=None, description="host:port the pod serves on, for forwarding; or null"
    )
    created_at: float
    updated_at: float

    @classmethod
    def of(cls, r: EpochRecord, **extra: Any) -> Self:
        """The API shape of a ledger record (``extra``: a subclass's own fields)."""
        return cls(
            epoch=r.epoch,
            generation=r.generation,
            namespace=r.namespace,
            server=r.server,
            state=r.state,
            pod_name=r.pod_name,
            pod_uid=r.pod_uid,
            incarnation=r.incarnation,
            process_epoch=r.process_epoch,
            revision=r.revision,
            address=r.address,
            created_at=r.created_at,
            updated_at=r.updated_at,
            **extra,
        )


class EpochLookup(Epoch):
    """``GET /v1/epochs/{epoch}``; for a process epoch, also that process's own state."""

    requested: str
    process_state: State | None = Field(
        default=None,
        description="for a process epoch: the pod epoch's state if it is the newest "
        "incarnation, `retired` if a newer one replaced it",
    )


class Incarnation(BaseModel):
    process_epoch: str
    incarnation: int
    epoch: Epoch


class EpochList(BaseModel):
    ledger_id: str
    revision: int = Field(description="the ledger revision this list is consistent with")
    epochs: list[Epoch]


class ErrorBody(BaseModel):
    code: str
    message: str
