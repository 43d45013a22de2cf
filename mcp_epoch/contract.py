"""The contract every part of mcp-epoch agrees on: names, formats, states and defaults.

The epoch service, the operator, the replica library and (through a test) the chart and the CRD
all take these from here, so that none of them can drift from the others. It imports nothing
but the standard library's ``re`` and ``dataclasses``.

Epoch tokens (see docs/design.md, "Epochs"); every part accepts and rejects exactly the same
strings:

- pod epoch      ``<ledger8>-<generation>``                e.g. ``9f2c1a7e-42``
- process epoch  ``<pod epoch>.<incarnation>``             e.g. ``9f2c1a7e-42.0``

``ledger8`` is eight lowercase hex digits; generation and incarnation are decimal integers
without sign or leading zeros. Generation 0 is never issued by a ledger (generations start at 1),
and incarnations at or above ``FALLBACK_INCARNATION_MIN`` are never issued either: both are
reserved for processes that could not register with the service, so their cursors can never be
mistaken for another process's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final, Literal

# --- the Kubernetes API of the operator -------------------------------------------------------

GROUP: Final = "mcp.epochs.dev"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"
KIND: Final = "McpServer"
PLURAL: Final = "mcpservers"
SHORT_NAME: Final = "mcps"
#: Pod label marking a pod whose process needs an epoch; its value is the server name.
SERVER_LABEL: Final = f"{GROUP}/server"
#: Pod annotation recording the pod epoch the webhook injected.
EPOCH_ANNOTATION: Final = f"{GROUP}/epoch"
#: Pod annotations that size the replay buffer of a plain (non-McpServer) Deployment's pods.
WINDOW_ANNOTATION: Final = f"{GROUP}/reconnect-window-seconds"
RATE_ANNOTATION: Final = f"{GROUP}/events-per-second"
#: Pod annotations of a plain Deployment's pods: the port the MCP server serves on (default:
#: the first container port), and how long a draining process may finish its calls.
PORT_ANNOTATION: Final = f"{GROUP}/port"
DRAIN_ANNOTATION: Final = f"{GROUP}/drain-seconds"
PRESTOP_ANNOTATION: Final = f"{GROUP}/prestop-seconds"
#: Pod annotation of a plain Deployment's pods: ``"off"`` keeps a draining process from
#: handing its sessions on (tools that keep per-session state in process memory).
HANDOFF_ANNOTATION: Final = f"{GROUP}/handoff"
#: On an McpServer: set to a new value (a date, a ticket) to rotate its request-state key ring.
ROTATE_ANNOTATION: Final = f"{GROUP}/rotate-request-state"

# --- the environment of an epoch-managed container --------------------------------------------

ENV_EPOCH: Final = "MCP_EPOCH"
ENV_SERVICE_URL: Final = "MCP_EPOCH_SERVICE_URL"
ENV_SERVICE_TOKEN: Final = "MCP_EPOCH_SERVICE_TOKEN"
#: A file holding the credential (re-read on every call: the kubelet rotates a projected token).
ENV_SERVICE_TOKEN_FILE: Final = "MCP_EPOCH_SERVICE_TOKEN_FILE"
ENV_NAMESPACE: Final = "MCP_SERVER_NAMESPACE"
ENV_SERVER: Final = "MCP_SERVER_NAME"
ENV_POD_NAME: Final = "MCP_POD_NAME"
ENV_POD_UID: Final = "MCP_POD_UID"
ENV_BUFFER: Final = "MCP_RESUME_BUFFER_EVENTS"
ENV_DRAIN: Final = "MCP_EPOCH_DRAIN_SECONDS"
#: ``off``: a draining process hands no session on (for a server whose tools keep per-session
#: state in process memory, which does not move); anything else, or unset: on.
ENV_HANDOFF: Final = "MCP_EPOCH_HANDOFF"
#: How often a replica looks for a new revision of its server's request-state ring.
ENV_RING_REFRESH: Final = "MCP_EPOCH_RING_REFRESH_SECONDS"
#: Every variable the operator injects (the CRD forbids them in ``spec.env``).
INJECTED_ENV: Final = (
    ENV_EPOCH,
    ENV_SERVICE_URL,
    ENV_SERVICE_TOKEN,
    ENV_SERVICE_TOKEN_FILE,
    ENV_NAMESPACE,
    ENV_SERVER,
    ENV_POD_NAME,
    ENV_POD_UID,
    ENV_BUFFER,
    ENV_DRAIN,
    ENV_HANDOFF,
)

# --- what a probe and Prometheus read from an epoch-safe server -------------------------------

#: 200 while the process can act safely on its own, 503 before it has started, while the epoch
#: service refuses its credentials and while it drains (an McpServer's readiness probe).
READY_PATH: Final = "/readyz"
METRICS_PATH: Final = "/metrics"

# --- per-pod identity --------------------------------------------------------------------------

#: The audience of the projected ServiceAccount tokens pods present to the epoch service; the
#: service refuses a token minted for any other audience (e.g. the API server's own).
TOKEN_AUDIENCE: Final = "mcp-epoch"
#: The projected token the webhook mounts into every epoch-managed container.
TOKEN_VOLUME: Final = "mcp-epoch-token"
TOKEN_MOUNT_PATH: Final = "/var/run/secrets/mcp.epochs.dev"
TOKEN_FILE: Final = f"{TOKEN_MOUNT_PATH}/token"
#: Lifetime the kubelet is asked for (it refreshes a token at 80 % of it).
TOKEN_EXPIRATION_SECONDS: Final = 3600

# --- the lifecycle of a pod epoch ---------------------------------------------------------------

State = Literal["pending", "live", "draining", "retired", "abandoned"]
STATES: Final[tuple[State, ...]] = ("pending", "live", "draining", "retired", "abandoned")
#: States whose pod may still exist (anything else is a tombstone).
ACTIVE_STATES: Final[tuple[State, ...]] = ("pending", "live", "draining")

# --- a rejected resumption on the wire ----------------------------------------------------------

#: Response header of a rejected resumption; its value is the reason.
REJECTED_HEADER: Final = "mcp-resumption-rejected"
Reason = Literal["gap", "live-elsewhere", "draining", "retired", "unknown"]
REASONS: Final[tuple[Reason, ...]] = ("gap", "live-elsewhere", "draining", "retired", "unknown")

# --- forwarding to a session's owner -------------------------------------------------------------
#: Request header of a forwarded request: the process epoch it is meant for. The receiver serves
#: it only if that is its own epoch, and never forwards it again (a hop limit of one).
FORWARDED_TO_HEADER: Final = "mcp-epoch-forwarded-to"
#: Response header the forwarding replica adds: the process epoch that really answered.
FORWARDED_BY_HEADER: Final = "mcp-epoch-forwarded-by"
#: Response header on every answer of a session-era request: the process epoch that answered
#: it (a forwarded answer keeps its owner's), whatever the server behind mcp-epoch says.
SERVED_BY_HEADER: Final = "mcp-epoch-served-by"
#: Response header of a forwarded resumption that replays a call's stream (which ends with the
#: call's answer), not the open-ended standalone stream: the relaying replica's drain waits for
#: it, as for a forwarded POST, because the owner counts the call delivered once it wrote the
#: answer to the relay.
CALL_STREAM_HEADER: Final = "mcp-epoch-call-stream"
#: Response header of a process's 421 to a forwarded request of a session it handed on: the
#: process epoch that holds the session now (the forwarding replica sends it there instead).
MOVED_TO_HEADER: Final = "mcp-epoch-moved-to"
#: Response header of a resumption served from a handed-over tail: the process epoch whose
#: own buffered events (under its own IDs) the replay comes from.
TAIL_OF_HEADER: Final = "mcp-epoch-tail-of"
#: Where a process takes the sessions a draining peer of its server hands it (``POST``, one
#: JSON document; see the library's handover module). Never reached through a balancer.
HANDOFF_PATH: Final = "/.well-known/mcp-epoch/handoff"
#: Request header of a hand-on: the process epoch handing its sessions on. The receiver takes
#: them only if the ledger's handoff rule names it as that process's successor.
HANDOFF_FROM_HEADER: Final = "mcp-epoch-handoff-from"

# --- the sidecar (``mcp-epoch proxy``) in a pod -----------------------------------------------

#: Pod annotation choosing the data plane: ``library`` (the server runs mcp_epoch itself, the
#: default) or ``sidecar`` (the webhook injects ``mcp-epoch proxy`` in front of the server).
DATA_PLANE_ANNOTATION: Final = "mcp.epochs.dev/data-plane"
DATA_PLANES: Final = ("library", "sidecar")
#: Pod annotation: the port the MCP server listens on inside the pod (``127.0.0.1``), behind the
#: sidecar. Required with the sidecar.
UPSTREAM_PORT_ANNOTATION: Final = "mcp.epochs.dev/upstream-port"
#: Pod annotation: the port the sidecar serves clients on (the pod's MCP port; default 8080).
SIDECAR_PORT_ANNOTATION: Final = "mcp.epochs.dev/port"
#: The injected native sidecar container (an init container with ``restartPolicy: Always``).
SIDECAR_CONTAINER: Final = "mcp-epoch-sidecar"
#: Where the main container's preStop asks the sidecar to drain, and waits until it has: the
#: kubelet signals a pod's main containers first and its native sidecars only once they have
#: exited, so the upstream must keep serving until the sidecar's drain is over.
DRAIN_PATH: Final = "/.well-known/mcp-epoch/drain"
#: Request header of a drain request; its value must equal the sidecar's ``MCP_EPOCH_DRAIN_TOKEN``
#: (the webhook puts a fresh one in each pod), so nothing else in the cluster can drain a pod.
DRAIN_TOKEN_HEADER: Final = "mcp-epoch-drain-token"
ENV_DRAIN_TOKEN: Final = "MCP_EPOCH_DRAIN_TOKEN"
#: Seconds a drain request waits before draining (the pod leaves its Service's endpoints
#: meanwhile), as the library's preStop sleep does before SIGTERM.
ENV_PRESTOP: Final = "MCP_EPOCH_PRESTOP_SECONDS"
#: Session IDs minted through the guard: ``<process epoch>_<32 hex digits>`` (visible ASCII, as
#: the Streamable HTTP transport requires; the hex part is the SDK's own unguessable ID).
SESSION_SEPARATOR: Final = "_"

# --- defaults -----------------------------------------------------------------------------------

#: Replay buffer: reconnect window (s) x event rate (events/s), e.g. 30 s x 100/s.
DEFAULT_RECONNECT_WINDOW_SECONDS: Final = 30
DEFAULT_EVENTS_PER_SECOND: Final = 100
DEFAULT_BUFFER_EVENTS: Final = DEFAULT_RECONNECT_WINDOW_SECONDS * DEFAULT_EVENTS_PER_SECOND
#: The operator never sizes a buffer beyond this (the CRD refuses larger products).
MAX_OPERATOR_BUFFER_EVENTS: Final = 1_000_000
#: Graceful drain: a draining process finishes its calls within this many seconds; the pod's
#: preStop hook waits first, so the endpoints are updated before SIGTERM arrives.
DEFAULT_DRAIN_SECONDS: Final = 25
DEFAULT_RING_REFRESH_SECONDS: Final = 5.0
DEFAULT_PRESTOP_SECONDS: Final = 3
DEFAULT_MIN_READY_SECONDS: Final = 3
#: The longest long poll the service holds open (a replica never asks for more).
MAX_WAIT_SECONDS: Final = 55.0

# --- epoch tokens ---------------------------------------------------------------------------------

LEDGER_PREFIX_LEN = 8
# Bounded so that a token always fits comfortably in a header and a database column.
MAX_DECIMAL_DIGITS = 19
MAX_GENERATION = 2**63 - 1
# The ledger issues incarnations 0, 1, 2, ... and refuses to go past this bound; random
# fallback incarnations are drawn from [FALLBACK_INCARNATION_MIN, MAX_GENERATION].
FALLBACK_INCARNATION_MIN = 2**40


def _decimal_at_most(bound: int) -> str:
    """A regex for the decimals 0..``bound`` without leading zeros, so that a pattern (the
    OpenAPI document's too) accepts exactly the numbers the ledger can hold."""
    digits = str(bound)
    alts = ["0"]
    if len(digits) > 1:
        alts.append(f"[1-9][0-9]{{0,{len(digits) - 2}}}")  # fewer digits than the bound
    for i, d in enumerate(digits):  # as many digits: equal up to i, lower at i
        low = 1 if i == 0 else 0
        if int(d) > low:
            rest = len(digits) - i - 1
            alts.append(digits[:i] + f"[{low}-{int(d) - 1}]" + (f"[0-9]{{{rest}}}" if rest else ""))
    alts.append(digits)
    return "(?:" + "|".join(alts) + ")"


_DEC = _decimal_at_most(MAX_GENERATION)
POD_EPOCH_PATTERN = rf"[0-9a-f]{{{LEDGER_PREFIX_LEN}}}-{_DEC}"
PROCESS_EPOCH_PATTERN = rf"{POD_EPOCH_PATTERN}\.{_DEC}"
#: Either kind (``GET /v1/epochs/{epoch}`` takes both).
ANY_EPOCH_PATTERN = rf"{POD_EPOCH_PATTERN}(?:\.{_DEC})?"
POD_EPOCH_RE = re.compile(rf"\A({POD_EPOCH_PATTERN})\Z")
PROCESS_EPOCH_RE = re.compile(rf"\A({POD_EPOCH_PATTERN})\.({_DEC})\Z")
# Longest process epoch: 8 + 1 + 19 + 1 + 19.
MAX_PROCESS_EPOCH_LEN = LEDGER_PREFIX_LEN + 1 + MAX_DECIMAL_DIGITS + 1 + MAX_DECIMAL_DIGITS

# Kubernetes names (apimachinery's validation rules).
DNS1123_LABEL_PATTERN = r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?"
DNS1123_LABEL_RE = re.compile(rf"\A{DNS1123_LABEL_PATTERN}\Z")
DNS1123_SUBDOMAIN_RE = re.compile(
    r"\A(?=.{1,253}\Z)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\Z"
)
# Admission request UIDs and pod UIDs are UUIDs in practice; accept a safe superset.
UID_PATTERN = r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}"
UID_RE = re.compile(rf"\A{UID_PATTERN}\Z")


def _bounded_int(text: str, what: str) -> int:
    value = int(text)
    if value > MAX_GENERATION:
        raise ValueError(f"{what} {text} is larger than {MAX_GENERATION}")
    return value


@dataclass(frozen=True, slots=True, order=True)
class PodEpoch:
    """A pod epoch: which ledger issued it and its generation in that ledger."""

    ledger8: str
    generation: int

    def __str__(self) -> str:
        return f"{self.ledger8}-{self.generation}"

    @classmethod
    def parse(cls, raw: str) -> PodEpoch:
        if not isinstance(raw, str):
            raise ValueError(f"a pod epoch must be a string, not {type(raw).__name__}")
        if len(raw) > MAX_PROCESS_EPOCH_LEN or POD_EPOCH_RE.match(raw) is None:
            raise ValueError(
                f"malformed pod epoch {raw[:64]!r}: expected <8 hex digits>-<generation>, "
                "e.g. 9f2c1a7e-42"
            )
        ledger8, gen = raw.split("-", 1)
        return cls(ledger8, _bounded_int(gen, "generation"))


@dataclass(frozen=True, slots=True, order=True)
class ProcessEpoch:
    """A process epoch: one process start (incarnation) of a pod epoch."""

    pod: PodEpoch
    incarnation: int

    def __str__(self) -> str:
        return f"{self.pod}.{self.incarnation}"

    @property
    def is_fallback(self) -> bool:
        """True for epochs a ledger never issues (the process could not register)."""
        return self.pod.generation == 0 or self.incarnation >= FALLBACK_INCARNATION_MIN

    @classmethod
    def parse(cls, raw: str) -> ProcessEpoch:
        if not isinstance(raw, str):
            raise ValueError(f"a process epoch must be a string, not {type(raw).__name__}")
        m = PROCESS_EPOCH_RE.match(raw) if len(raw) <= MAX_PROCESS_EPOCH_LEN else None
        if m is None:
            raise ValueError(
                f"malformed process epoch {raw[:64]!r}: expected "
                "<8 hex digits>-<generation>.<incarnation>, e.g. 9f2c1a7e-42.0"
            )
        return cls(PodEpoch.parse(m.group(1)), _bounded_int(m.group(2), "incarnation"))


def parse_epoch(raw: str) -> PodEpoch | ProcessEpoch:
    """Parse either kind of epoch token (the service's ``GET /v1/epochs/{epoch}`` takes both)."""
    if isinstance(raw, str) and "." in raw:
        return ProcessEpoch.parse(raw)
    return PodEpoch.parse(raw)
