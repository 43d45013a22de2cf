"""The operator's own names; those shared with the other parts come from the contract."""

from __future__ import annotations

from mcp_epoch.contract import (
    API_VERSION,
    ENV_BUFFER,
    ENV_EPOCH,
    ENV_NAMESPACE,
    ENV_POD_NAME,
    ENV_POD_UID,
    ENV_SERVER,
    ENV_SERVICE_TOKEN,
    ENV_SERVICE_URL,
    EPOCH_ANNOTATION,
    GROUP,
    KIND,
    PLURAL,
    SERVER_LABEL,
    SHORT_NAME,
    VERSION,
)

__all__ = [
    "API_VERSION",
    "ENV_BUFFER",
    "ENV_EPOCH",
    "ENV_NAMESPACE",
    "ENV_POD_NAME",
    "ENV_POD_UID",
    "ENV_SERVER",
    "ENV_SERVICE_TOKEN",
    "ENV_SERVICE_URL",
    "EPOCH_ANNOTATION",
    "FIELD_MANAGER",
    "GROUP",
    "KIND",
    "MANAGED_BY_LABEL",
    "MANAGED_BY_VALUE",
    "PLURAL",
    "SERVER_LABEL",
    "SHORT_NAME",
    "VERSION",
    "WEBHOOK_ID",
    "WEBHOOK_NAME",
    "WEBHOOK_PATH",
]
#: Label on the Deployment and Service an McpServer owns (selects them for drift checks).
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY_VALUE = "mcp-epoch-operator"
#: Field manager for server-side apply: the fields the operator owns.
FIELD_MANAGER = "mcp-epoch-operator"

#: The webhook handler id; it is also the URL path the webhook configuration points at.
WEBHOOK_ID = "inject-epoch"
WEBHOOK_PATH = f"/{WEBHOOK_ID}"
#: Name of the single webhook entry inside the MutatingWebhookConfiguration.
WEBHOOK_NAME = f"epochs.{GROUP}"
