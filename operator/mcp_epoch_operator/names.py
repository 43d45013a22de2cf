"""Names that must agree with docs/design.md, the CRD, the chart and the replica library."""

from __future__ import annotations

GROUP = "mcp.epochs.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "McpServer"
PLURAL = "mcpservers"
SHORT_NAME = "mcps"

#: Pod label marking a pod whose process needs an epoch; its value is the server name.
SERVER_LABEL = f"{GROUP}/server"
#: Pod annotation recording the pod epoch the webhook injected.
EPOCH_ANNOTATION = f"{GROUP}/epoch"
#: Label on the Deployment and Service an McpServer owns (selects them for drift checks).
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY_VALUE = "mcp-epoch-operator"
#: Field manager for server-side apply: the fields the operator owns.
FIELD_MANAGER = "mcp-epoch-operator"

ENV_EPOCH = "MCP_EPOCH"
ENV_SERVICE_URL = "MCP_EPOCH_SERVICE_URL"
ENV_SERVICE_TOKEN = "MCP_EPOCH_SERVICE_TOKEN"
ENV_NAMESPACE = "MCP_SERVER_NAMESPACE"
ENV_SERVER = "MCP_SERVER_NAME"
ENV_POD_NAME = "MCP_POD_NAME"
ENV_POD_UID = "MCP_POD_UID"
ENV_BUFFER = "MCP_RESUME_BUFFER_EVENTS"

#: The webhook handler id; it is also the URL path the webhook configuration points at.
WEBHOOK_ID = "inject-epoch"
WEBHOOK_PATH = f"/{WEBHOOK_ID}"
#: Name of the single webhook entry inside the MutatingWebhookConfiguration.
WEBHOOK_NAME = f"epochs.{GROUP}"
