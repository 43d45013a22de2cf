"""This process's epoch, fixed once at start.

A container restart keeps the pod's environment but loses the process's memory, so each start
registers a new incarnation. When that is impossible (no ``MCP_EPOCH``, service unreachable or
refusing) the process takes a random incarnation the ledger never issues: its cursors are then
rejected everywhere else, which is safe, and never mistaken for another process's.
"""

from __future__ import annotations

import logging
import secrets
import time
from dataclasses import dataclass

import httpx

from mcp_epoch import api
from mcp_epoch._internal.config import ReplicaConfig
from mcp_epoch.api_client import (
    EpochServiceError,
    EpochServiceUnavailable,
    SyncEpochServiceClient,
)
from mcp_epoch.contract import (
    FALLBACK_INCARNATION_MIN,
    LEDGER_PREFIX_LEN,
    MAX_GENERATION,
    PodEpoch,
    ProcessEpoch,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ProcessStart:
    epoch: ProcessEpoch
    registered: bool  # False: a fallback epoch the ledger never issued
    detail: str


def fallback_epoch(pod: PodEpoch | None = None) -> ProcessEpoch:
    """A random process epoch outside anything a ledger issues (see ``mcp_epoch.contract``)."""
    if pod is None:
        pod = PodEpoch(secrets.token_hex(LEDGER_PREFIX_LEN // 2), 0)
    span = MAX_GENERATION - FALLBACK_INCARNATION_MIN + 1
    return ProcessEpoch(pod, FALLBACK_INCARNATION_MIN + secrets.randbelow(span))


#: How long a start waits for the operator to bind this pod's epoch (``not-bound``): it binds
#: on first sight of the pod, normally before the container starts.
BIND_WAIT_SECONDS = 30.0


def _register(
    client: SyncEpochServiceClient, config: ReplicaConfig, pod: PodEpoch
) -> tuple[ProcessEpoch | None, str, str | None]:
    """(epoch or None, what happened, the service's error code or ``unreachable``)."""
    try:
        call = api.register_incarnation(str(pod), config.pod_name or None, config.pod_uid or None)
        answer = client.send(call)
        epoch = ProcessEpoch.parse(answer.process_epoch)
    except EpochServiceUnavailable as exc:
        return None, f"cannot register: {exc}", "unreachable"
    except EpochServiceError as exc:
        return None, f"service answered {exc.status} ({exc.code})", exc.code
    except ValueError as exc:  # a pod name or UID the API would refuse, a malformed answer
        return None, f"cannot register: {exc}", None
    if epoch.pod != pod:
        return None, f"service returned {epoch} for pod epoch {pod}", None
    return epoch, "registered", None


def start_process_epoch(
    config: ReplicaConfig | None = None,
    *,
    attempts: int = 3,
    timeout: float = 2.0,
    bind_wait: float = BIND_WAIT_SECONDS,
    transport: httpx.BaseTransport | None = None,
) -> ProcessStart:
    """Register this process start with the epoch service, or fall back (with a warning).

    Transport errors are retried ``attempts`` times; ``not-bound`` (the operator has not yet
    bound the epoch to this pod) is retried until ``bind_wait`` has passed; any other refusal
    is final."""
    cfg = ReplicaConfig.from_env() if config is None else config
    if cfg.pod_epoch is None:
        start = ProcessStart(fallback_epoch(), False, "MCP_EPOCH is not set")
        log.warning("using fallback process epoch %s: %s", start.epoch, start.detail)
        return start
    try:
        pod = PodEpoch.parse(cfg.pod_epoch)
    except ValueError as exc:
        start = ProcessStart(fallback_epoch(), False, f"MCP_EPOCH is malformed: {exc}")
        log.warning("using fallback process epoch %s: %s", start.epoch, start.detail)
        return start
    detail = "MCP_EPOCH_SERVICE_URL is not set"
    if cfg.service_url:
        bind_deadline = time.monotonic() + bind_wait
        failures = 0
        with SyncEpochServiceClient(
            cfg.service_url, cfg.credential, timeout=timeout, transport=transport
        ) as client:
            while True:
                epoch, detail, code = _register(client, cfg, pod)
                if epoch is not None:
                    log.info("process epoch %s registered", epoch)
                    return ProcessStart(epoch, True, detail)
                if code == "unreachable":
                    failures += 1
                    if failures >= max(1, attempts):
                        break
                    time.sleep(min(0.25 * 2 ** (failures - 1), 1.0))
                elif code == "not-bound" and time.monotonic() < bind_deadline:
                    time.sleep(0.2)  # a retry interval, not a synchronisation: the answer decides
                else:
                    break  # the service answered and refused: retrying will not change that
    start = ProcessStart(fallback_epoch(pod), False, detail)
    log.warning("using fallback process epoch %s: %s", start.epoch, start.detail)
    return start
