"""The operator's settings, gathered by ``cli`` from flags and environment (no kopf here)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from mcp_epoch_operator.resources import ReplicaDefaults


@dataclass(frozen=True, slots=True)
class WebhookServing:
    """Where and how this operator process serves the admission webhook."""

    listen: str
    port: int
    cert: Path
    key: Path
    #: CA bundle put into a self-registered configuration (None: the serving certificate).
    ca: Path | None = None
    #: Host name or address the API server uses to reach us (self-registration only).
    advertise: str | None = None
    #: Several operator processes on one host serve one port (SO_REUSEPORT: the kernel
    #: spreads connections over the live ones), as a Service spreads them over pods.
    share_port: bool = False
    #: ``host:port`` where the other operator processes reach this one when it holds the
    #: admission lease (in a pod: its IP); None: the listen address. With a shared port it
    #: must be an address of this process alone (it is listened on as well).
    peer: str | None = None

    @property
    def peer_address(self) -> str:
        return self.peer or f"{self.listen}:{self.port}"


@dataclass(frozen=True)
class OperatorConfig:
    """Everything the running operator needs to know."""

    #: None: every namespace; otherwise only these.
    namespaces: list[str] | None
    epoch_service_url: str
    #: The operator's credential, or a function that reads it afresh (a rotated token file).
    operator_token: str | Callable[[], str]
    replica: ReplicaDefaults
    operator_namespace: str
    webhook: WebhookServing | None = None
    register_webhook: bool = False
    webhook_config_name: str = "mcp-epoch-operator"
    webhook_timeout_seconds: int = 5
    excluded_namespaces: list[str] = field(default_factory=lambda: ["kube-system"])
    resync_interval: float = 30.0
    #: A rotation step that waits this long for the same pods is reported as stalled (a
    #: condition, a warning Event, and the gauge the stall alert reads).
    rotation_stall_seconds: float = 60.0
    epoch_service_ca: Path | None = None
    health_endpoint: str | None = None
    #: Where ``/metrics`` (Prometheus) is served; None: not served.
    metrics_port: int | None = None
    #: ConfigMap (in the operator's namespace) remembering which servers have epochs.
    servers_configmap: str = "mcp-epoch-operator-servers"
    #: The Lease (in the operator's namespace) whose holder hands out pod epochs.
    admission_lease: str = "mcp-epoch-operator-admission"
    admission_lease_seconds: float = 4.0
    #: Pod epochs per server issued ahead of admissions, and how long one is kept unused.
    epoch_pool_size: int = 8
    epoch_pool_max_age: float = 300.0

    def webhook_excluded_namespaces(self) -> list[str]:
        """kube-system and the operator's own namespace are never subject to the webhook."""
        return sorted({*self.excluded_namespaces, "kube-system", self.operator_namespace})
