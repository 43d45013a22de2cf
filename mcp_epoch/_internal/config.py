"""The replica's environment, as the operator injects it (names from :mod:`mcp_epoch.contract`)."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass

from mcp_epoch._internal.buffer import check_capacity
from mcp_epoch.contract import (
    DEFAULT_BUFFER_EVENTS,
    DEFAULT_DRAIN_SECONDS,
    DEFAULT_RING_REFRESH_SECONDS,
    ENV_BUFFER,
    ENV_DRAIN,
    ENV_DRAIN_TOKEN,
    ENV_EPOCH,
    ENV_HANDOFF,
    ENV_NAMESPACE,
    ENV_POD_NAME,
    ENV_POD_UID,
    ENV_PRESTOP,
    ENV_RING_REFRESH,
    ENV_SERVER,
    ENV_SERVICE_TOKEN,
    ENV_SERVICE_TOKEN_FILE,
    ENV_SERVICE_URL,
)

log = logging.getLogger("mcp_epoch")


def capacity_from_env(env: Mapping[str, str] | None = None) -> int:
    """Read ``MCP_RESUME_BUFFER_EVENTS``; a bad value fails loudly (it is a deployment bug)."""
    raw = (os.environ if env is None else env).get(ENV_BUFFER)
    if raw is None or raw.strip() == "":
        return DEFAULT_BUFFER_EVENTS
    text = raw.strip()
    if not text.isascii() or not text.isdigit():
        raise ValueError(f"{ENV_BUFFER}={raw!r} is not a positive integer")
    return check_capacity(int(text))


def seconds_from_env(
    env: Mapping[str, str], key: str, default: float, *, zero: bool = True
) -> float:
    """Read a number of seconds up to an hour (``zero``: 0 is allowed); a bad value fails
    loudly, as for the buffer."""
    raw = _get(env, key)
    if raw is None:
        return float(default)
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{key}={raw!r} is not a number of seconds") from None
    if not (value >= 0 if zero else value > 0) or value > 3600:
        interval = "0..3600" if zero else "(0, 3600]"
        raise ValueError(f"{key}={raw!r} is outside {interval} seconds")
    return value


def drain_from_env(env: Mapping[str, str]) -> float:
    """Read ``MCP_EPOCH_DRAIN_SECONDS``."""
    return seconds_from_env(env, ENV_DRAIN, DEFAULT_DRAIN_SECONDS)


def handoff_from_env(env: Mapping[str, str]) -> bool:
    """Read ``MCP_EPOCH_HANDOFF``: ``off`` (or ``false``, ``0``, ``no``) turns handoff off."""
    value = (_get(env, ENV_HANDOFF) or "on").lower()
    if value in ("off", "false", "0", "no"):
        return False
    if value not in ("on", "true", "1", "yes"):
        log.warning("%s=%r is neither on nor off: handoff stays on", ENV_HANDOFF, value)
    return True


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
    drain_seconds: float = float(DEFAULT_DRAIN_SECONDS)
    #: The pod's projected ServiceAccount token (wins over ``service_token``).
    service_token_file: str | None = None
    #: How often the request-state ring is looked at (``MCP_EPOCH_RING_REFRESH_SECONDS``).
    ring_refresh_seconds: float = DEFAULT_RING_REFRESH_SECONDS
    #: Whether a draining process hands its sessions on (``MCP_EPOCH_HANDOFF``, default on).
    handoff: bool = True
    #: The sidecar's drain trigger (``MCP_EPOCH_DRAIN_TOKEN``): None, no drain endpoint.
    drain_token: str | None = None
    #: How long a drain request waits before draining (``MCP_EPOCH_PRESTOP_SECONDS``).
    prestop_seconds: float = 0.0

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
            drain_seconds=drain_from_env(e),
            service_token_file=_get(e, ENV_SERVICE_TOKEN_FILE),
            ring_refresh_seconds=seconds_from_env(
                e, ENV_RING_REFRESH, DEFAULT_RING_REFRESH_SECONDS, zero=False
            ),
            handoff=handoff_from_env(e),
            drain_token=_get(e, ENV_DRAIN_TOKEN),
            prestop_seconds=seconds_from_env(e, ENV_PRESTOP, 0.0),
        )

    def credential(self) -> str | None:
        """The token to present now. A token file is read on every call: the kubelet rotates
        a projected token in place, so a copy taken at start would expire."""
        if self.service_token_file:
            try:
                with open(self.service_token_file, encoding="utf-8") as f:
                    return f.read().strip() or None
            except OSError as exc:
                log.error(
                    "cannot read %s=%s (%s): calls to the epoch service go unauthenticated",
                    ENV_SERVICE_TOKEN_FILE,
                    self.service_token_file,
                    exc,
                )
                return None
        return self.service_token
