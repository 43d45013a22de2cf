"""The epoch service's v1 API as types: every request and response body, and every call.

The service validates requests and writes answers with these very models, and every caller
(the operator, the replica library, the demo, the tests) parses answers with them, so a field
means the same thing on both sides of the wire by construction. A :class:`Call` is one request
with the model of its answer; :mod:`mcp_epoch.api_client` sends it, synchronously or not.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Generic, Literal, TypeVar
from urllib.parse import quote

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StringConstraints

from mcp_epoch.contract import (
    DNS1123_LABEL_PATTERN,
    LEDGER_PREFIX_LEN,
    MAX_PROCESS_EPOCH_LEN,
    PROCESS_EPOCH_PATTERN,
    UID_PATTERN,
    State,
)

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
    """Request bodies: no unknown field, no coercion (a number is not a name)."""

    model_config = ConfigDict(extra="forbid", strict=True)


class IssueRequest(_Strict):
    namespace: K8sName
    server: K8sName = Field(description="the McpServer (or labelled Deployment) name")
    request_uid: Uid = Field(description="the admission request UID; issuing is idempotent on it")


#: The most epochs one batch issue asks for.
MAX_ISSUE_BATCH = 64


class IssueBatchRequest(_Strict):
    request_uids: list[Uid] = Field(
        min_length=1,
        max_length=MAX_ISSUE_BATCH,
        description="one per epoch; issuing is idempotent on each",
    )


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


ProcessEpochText = Annotated[
    str, StringConstraints(pattern=rf"^{PROCESS_EPOCH_PATTERN}$", max_length=MAX_PROCESS_EPOCH_LEN)
]


class HandoffRequest(_Strict):
    successor: ProcessEpochText = Field(
        description="the live process (of the same server, in another pod) that takes this "
        "process's sessions"
    )
    pod_uid: Uid | None = Field(
        default=None,
        description="with the shared replica token: the UID of the pod the epoch is bound to",
    )


class Epoch(BaseModel):
    """A pod epoch as the ledger holds it. Answers may carry fields a newer service added;
    they are ignored, not refused."""

    epoch: str
    generation: int
    namespace: str
    server: str
    state: State
    pod_name: str | None
    pod_uid: str | None
    incarnation: int | None = Field(ge=0, description="the newest incarnation, or null")
    process_epoch: str | None = Field(description="the newest process epoch, or null")
    revision: int = Field(description="the ledger revision of this epoch's last change")
    address: str | None = Field(
        default=None,
        min_length=1,
        max_length=300,
        description="host:port the pod serves on, for forwarding; or null",
    )
    successor: str | None = Field(
        default=None,
        description="the handoff rule: the process epoch that took the sessions of process "
        "`successor_of` of this pod epoch; or null",
    )
    successor_of: int | None = Field(
        default=None, ge=0, description="the incarnation whose sessions went to `successor`"
    )
    created_at: float
    updated_at: float


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


class IssuedEpochs(BaseModel):
    """A batch issue's answer: one epoch per request UID, lowest generation first."""

    epochs: list[Epoch]


class EpochList(BaseModel):
    ledger_id: str = Field(min_length=LEDGER_PREFIX_LEN)
    revision: int = Field(description="the ledger revision this list is consistent with")
    epochs: list[Epoch]


def _integral(value: Any) -> Any:
    """JSON Schema counts 4977.0 as an integer, so the document's ``integer`` takes it; any
    other float, a string or a boolean is still refused (the models never coerce)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


#: A JSON integer, as JSON Schema defines one.
JsonInt = Annotated[int, BeforeValidator(_integral)]


class RingReport(_Strict):
    revision: JsonInt = Field(
        ge=1, description="the request-state ring revision this process holds"
    )


class DrainReport(_Strict):
    """How a process's drain ended, sent by the process just before it exits. The service
    counts it (``epochsvc_drains_total``): the process's own ``/metrics`` leave with it."""

    deadline: bool = Field(description="the drain deadline passed with calls still in flight")
    in_flight: JsonInt = Field(ge=0, description="calls in flight when the drain began")
    abandoned: JsonInt = Field(ge=0, description="calls still in flight at its end (cut)")
    handed: JsonInt = Field(ge=0, description="sessions handed on to a live peer")
    kept: JsonInt = Field(ge=0, description="sessions that could not move and end here")
    seconds: float = Field(ge=0, description="how long the drain took")
    pod_uid: Uid | None = Field(
        default=None,
        description="with the shared replica token: the UID of the pod the epoch is bound to",
    )


#: How a drain ended: every call finished, or the deadline cut calls still in flight.
DrainOutcome = Literal["clean", "deadline"]
DRAIN_OUTCOMES: tuple[DrainOutcome, ...] = ("clean", "deadline")


class DrainRecorded(BaseModel):
    """What the service counted a drain report as."""

    namespace: str
    server: str
    outcome: DrainOutcome = Field(description="clean, or deadline")


class RequestStateRing(BaseModel):
    """A server's request-state key ring, as its own pods load it (and no other caller)."""

    namespace: str
    server: str
    revision: int = Field(ge=1)
    phase: str = Field(description="steady, adding or switching")
    ttl_seconds: float = Field(gt=0, description="how long a sealed state stays valid")
    keys: list[str] = Field(
        repr=False, min_length=1, description="base64 secrets; keys[0] seals, every key opens"
    )


class RingHeld(BaseModel):
    """What a pod's report recorded, against the ring as it is now: a ``current_revision``
    above ``revision`` means the ring moved on (the last holder's report steps a rotation),
    so the reporter loads it again at once."""

    revision: int
    current_revision: int


class RingHolder(BaseModel):
    pod: str
    revision: int | None = Field(description="the ring revision its newest process holds")


class RingStatus(BaseModel):
    """A ring's rotation as the operator sees it: phases and pods, never a key."""

    namespace: str
    server: str
    revision: int | None = Field(description="null until a pod first loads the ring")
    phase: str
    ttl_seconds: float
    updated_at: float | None = Field(default=None, description="when the ring last changed")
    started_at: float | None = Field(description="when the rotation under way began")
    switched_at: float | None = Field(
        description="when every live pod was first seen sealing with the new key"
    )
    drop_due: float | None = Field(description="when the old key may leave the ring")
    holders: list[RingHolder]
    behind: list[str] = Field(description="pods that do not hold this revision yet")
    waiting: str | None = Field(description="what the rotation waits for, if anything")
    advanced: bool = Field(default=False, description="this call moved the rotation on")


class ErrorBody(BaseModel):
    code: str
    message: str


class Readiness(BaseModel):
    status: str
    ledger_id: str


# --- the calls ---------------------------------------------------------------------------------

T = TypeVar("T", bound=BaseModel)
Params = Sequence[tuple[str, str | int | float]]


@dataclass(frozen=True, slots=True)
class Call(Generic[T]):
    """One request of the API and the model of its answer; ``name`` says which (in logs and
    metrics)."""

    name: str
    method: str
    path: str
    answer: type[T]
    body: BaseModel | None = None
    params: Params = ()

    def json(self) -> dict[str, Any] | None:
        """The request body as sent (unset optional fields left out)."""
        return None if self.body is None else self.body.model_dump(mode="json", exclude_none=True)


def _seg(value: str) -> str:
    return quote(value, safe="")


def issue(namespace: str, server: str, request_uid: str) -> Call[Epoch]:
    """Issue a pod epoch (a repeated ``request_uid`` returns the one it issued)."""
    body = IssueRequest(namespace=namespace, server=server, request_uid=request_uid)
    return Call("issue", "POST", "/v1/epochs", Epoch, body)


def issue_batch(namespace: str, server: str, request_uids: list[str]) -> Call[IssuedEpochs]:
    """Issue a pod epoch per request UID in one call (the operator's pool), each idempotent
    on its UID as :func:`issue` is."""
    body = IssueBatchRequest(request_uids=request_uids)
    path = f"/v1/servers/{_seg(namespace)}/{_seg(server)}/epochs"
    return Call("issue_batch", "POST", path, IssuedEpochs, body)


def bind(epoch: str, pod_name: str, pod_uid: str, address: str | None = None) -> Call[Epoch]:
    body = BindRequest(pod_name=pod_name, pod_uid=pod_uid, address=address)
    return Call("bind", "POST", f"/v1/epochs/{_seg(epoch)}/bind", Epoch, body)


def drain(epoch: str) -> Call[Epoch]:
    return Call("drain", "POST", f"/v1/epochs/{_seg(epoch)}/drain", Epoch)


def retire(epoch: str) -> Call[Epoch]:
    return Call("retire", "POST", f"/v1/epochs/{_seg(epoch)}/retire", Epoch)


def register_incarnation(
    pod_epoch: str, pod_name: str | None = None, pod_uid: str | None = None
) -> Call[Incarnation]:
    """A process start of the pod that holds ``pod_epoch``."""
    body = IncarnationRequest(pod_name=pod_name, pod_uid=pod_uid)
    path = f"/v1/epochs/{_seg(pod_epoch)}/incarnations"
    return Call("register_incarnation", "POST", path, Incarnation, body)


def record_handoff(process_epoch: str, successor: str, pod_uid: str | None = None) -> Call[Epoch]:
    """Process ``process_epoch`` hands its sessions to the live process ``successor``."""
    body = HandoffRequest(successor=successor, pod_uid=pod_uid)
    return Call("record_handoff", "PUT", f"/v1/epochs/{_seg(process_epoch)}/successor", Epoch, body)


def report_drain(process_epoch: str, report: DrainReport) -> Call[DrainRecorded]:
    """Process ``process_epoch`` says how its drain ended, as it exits (counted, not stored)."""
    path = f"/v1/epochs/{_seg(process_epoch)}/drain-report"
    return Call("report_drain", "POST", path, DrainRecorded, report)


def get_epoch(epoch: str) -> Call[EpochLookup]:
    """A pod epoch or a process epoch."""
    return Call("get_epoch", "GET", f"/v1/epochs/{_seg(epoch)}", EpochLookup)


def list_server(
    namespace: str, server: str, since: int | None = None, wait: float | None = None
) -> Call[EpochList]:
    """A server's epochs (tombstones included); with ``since``, a long poll that answers once
    the ledger's revision has passed it or ``wait`` seconds have gone by."""
    path = f"/v1/servers/{_seg(namespace)}/{_seg(server)}/epochs"
    return Call("list_server", "GET", path, EpochList, None, _since(since, wait))


def _since(since: int | None, wait: float | None) -> list[tuple[str, str | int | float]]:
    """A long poll's query: ``wait`` only with ``since``."""
    params: list[tuple[str, str | int | float]] = []
    if since is not None:
        params.append(("since", since))
        if wait is not None:
            params.append(("wait", wait))
    return params


def _ring_path(namespace: str, server: str) -> str:
    return f"/v1/servers/{_seg(namespace)}/{_seg(server)}/request-state"


def request_state_ring(
    namespace: str, server: str, since: int | None = None, wait: float | None = None
) -> Call[RequestStateRing]:
    """The server's key ring (made on first use); only the server's own pods may load it.
    With ``since``, a long poll that answers once the ring's revision has passed it or
    ``wait`` seconds have gone by."""
    path = f"{_ring_path(namespace, server)}/ring"
    return Call("request_state_ring", "GET", path, RequestStateRing, None, _since(since, wait))


def report_ring(process_epoch: str, revision: int) -> Call[RingHeld]:
    """This process (its process epoch) holds ring ``revision`` now: it opens with every key
    of that revision and seals with its first."""
    path = f"/v1/epochs/{_seg(process_epoch)}/request-state"
    return Call("report_ring", "PUT", path, RingHeld, RingReport(revision=revision))


def ring_status(namespace: str, server: str) -> Call[RingStatus]:
    return Call("ring_status", "GET", _ring_path(namespace, server), RingStatus)


def rotate_ring(namespace: str, server: str) -> Call[RingStatus]:
    """Begin a rotation (409 ``rotation-in-progress`` while one is under way)."""
    return Call("rotate_ring", "POST", f"{_ring_path(namespace, server)}/rotate", RingStatus)


def advance_ring(namespace: str, server: str) -> Call[RingStatus]:
    """At most one step of the rotation under way, once every live pod holds its revision."""
    return Call("advance_ring", "POST", f"{_ring_path(namespace, server)}/advance", RingStatus)


def ready() -> Call[Readiness]:
    """The service's readiness (answers 200 only while its store does)."""
    return Call("ready", "GET", "/readyz", Readiness)


def lifecycle(
    verb: str, epoch: str, pod_name: str, pod_uid: str, address: str | None = None
) -> Call[Epoch]:
    """One lifecycle verb by name (bind, drain, retire)."""
    if verb == "bind":
        return bind(epoch, pod_name, pod_uid, address)
    if verb == "drain":
        return drain(epoch)
    if verb == "retire":
        return retire(epoch)
    raise ValueError(f"unknown lifecycle verb {verb!r}")
