"""Service settings, read from the environment with the prefix ``EPOCHSVC_``."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from mcp_epoch.contract import DNS1123_LABEL_PATTERN, MAX_WAIT_SECONDS, TOKEN_AUDIENCE

_ACCOUNT = rf"^{DNS1123_LABEL_PATTERN}/[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="EPOCHSVC_", extra="ignore")

    database_url: str = Field(
        default="sqlite:///./data/ledger.db",
        description="sqlite:///path/to/file.db (embedded default) or postgresql://user:pw@host/db",
    )
    # kubernetes: every caller presents a ServiceAccount token the API server verifies
    # (TokenReview). static: two shared tokens, an explicit opt-in for running outside a
    # cluster; unset ones are generated at start and printed once.
    auth: Literal["kubernetes", "static"] = "kubernetes"
    operator_token: SecretStr | None = None
    replica_token: SecretStr | None = None
    # kubernetes auth: the operator's ServiceAccount as namespace/name, the audience tokens
    # must carry, and how to reach the API server (default: the pod's own mounted account).
    operator_service_account: str | None = Field(default=None, pattern=_ACCOUNT)
    token_audience: str = Field(default=TOKEN_AUDIENCE, min_length=1)
    kube_api_url: str | None = None
    kube_ca_file: str | None = None
    kube_token_file: str | None = None
    # A verified token is trusted this long before the API server is asked again (a retired
    # pod's answers are dropped at once).
    token_cache_seconds: float = Field(default=10.0, ge=0)
    # A pending epoch whose pod is never seen becomes `abandoned` after this long.
    pending_timeout_seconds: float = Field(default=600.0, gt=0)
    # Retired and abandoned epochs are kept this long to classify late cursors, then compacted.
    tombstone_ttl_seconds: float = Field(default=86400.0, ge=0)
    sweep_interval_seconds: float = Field(default=10.0, gt=0)
    # Long polls are held at most this long (below common proxy idle timeouts of 60 s).
    max_wait_seconds: float = Field(default=MAX_WAIT_SECONDS, gt=0)
    # How often the long polls' catch-up reads each waited-on server's newest revision (once
    # per server, not per waiter), so a change no notification announced is answered anyway.
    poll_interval_seconds: float = Field(default=1.0, gt=0)
    # A server's request-state ring is made with this TTL (MCP 2026-07-28 multi-round-trip
    # state; the SDK's default). Pods seal with it, and a rotation keeps an old key this long
    # after every pod stopped sealing with it.
    request_state_ttl_seconds: float = Field(default=600.0, gt=0, le=86400)
    max_body_bytes: int = Field(default=16 * 1024, gt=0)
    # A longer request head (its target and header fields) gets 431 before it is buffered.
    max_header_bytes: int = Field(default=16 * 1024, gt=0)
    log_level: str = "info"
