"""Where ``mcp-epoch status`` finds the epoch service and a credential it accepts, read from the
operator's own Deployment (pure: the Deployment comes in as the API server's JSON).

The operator is the one client the epoch service lets read a ring's rotation, so status asks
with the operator's credential. The chart's Deployment says where that is:
``--epoch-service-url`` (or ``MCP_EPOCH_SERVICE_URL``), and ``--operator-token-file``, a file on
a volume that is either the chart's operator-token Secret (``auth.mode=static``) or a projected
ServiceAccount token for the service's audience (``auth.mode=kubernetes``). The first is read
with the admin's kubeconfig; the second is minted anew for the operator's ServiceAccount with a
TokenRequest, as ``kubectl create token`` does. Inside the operator's own pod the file itself
is there to read.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

#: The labels the chart puts on the operator's Deployment (part-of and component).
OPERATOR_SELECTOR = "app.kubernetes.io/part-of=mcp-epoch,app.kubernetes.io/component=operator"
URL_FLAG = "--epoch-service-url"
TOKEN_FILE_FLAG = "--operator-token-file"
CA_FLAG = "--epoch-service-ca"
URL_ENV = "MCP_EPOCH_SERVICE_URL"
TOKEN_ENV = "MCP_EPOCH_OPERATOR_TOKEN"


@dataclass(frozen=True, slots=True)
class FileToken:
    """A file in the operator's container (readable here only when this runs in that pod)."""

    path: str

    def describe(self) -> str:
        return f"file {self.path}"


@dataclass(frozen=True, slots=True)
class SecretToken:
    """A key of a Secret (static tokens)."""

    namespace: str
    name: str
    key: str

    def describe(self) -> str:
        return f"Secret {self.namespace}/{self.name} key {self.key}"


@dataclass(frozen=True, slots=True)
class AccountToken:
    """A token of the operator's ServiceAccount for the epoch service's audience (minted with a
    TokenRequest: the service then knows the caller as the operator)."""

    namespace: str
    service_account: str
    audience: str | None

    def describe(self) -> str:
        return (
            f"a TokenRequest for ServiceAccount {self.namespace}/{self.service_account} "
            f"(audience {self.audience or 'the API server'})"
        )


@dataclass(frozen=True, slots=True)
class LiteralToken:
    """A token written into the Deployment's environment (discouraged, but it happens)."""

    value: str = field(repr=False)

    def describe(self) -> str:
        return f"the operator's {TOKEN_ENV} value"


TokenSource = FileToken | SecretToken | AccountToken | LiteralToken


@dataclass(frozen=True, slots=True)
class OperatorSetup:
    """What the operator's Deployment says about reaching the epoch service."""

    namespace: str
    deployment: str
    url: str | None
    #: Where the operator's credential is, in the order to try (the file first: it is there
    #: when this runs inside the operator's pod).
    tokens: tuple[TokenSource, ...]
    #: The CA bundle of an https service, as a path in the operator's container.
    ca: str | None = None

    def describe(self) -> str:
        return f"Deployment {self.namespace}/{self.deployment}"


def _flags(argv: list[str]) -> dict[str, str]:
    """``--flag=value`` and ``--flag value`` forms; the last one wins, as argparse does."""
    out: dict[str, str] = {}
    for i, arg in enumerate(argv):
        if not arg.startswith("--"):
            continue
        name, eq, value = arg.partition("=")
        if eq:
            out[name] = value
        elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            out[name] = argv[i + 1]
    return out


def _operator_container(spec: dict[str, Any]) -> dict[str, Any] | None:
    """The container that runs ``mcp-epoch operator`` (the chart's has it as its first arg)."""
    for container in spec.get("containers") or []:
        argv = [*(container.get("command") or []), *(container.get("args") or [])]
        if "operator" in argv:
            return dict(container)
    return None


def _env_token(container: dict[str, Any], namespace: str) -> TokenSource | None:
    for env in container.get("env") or []:
        if env.get("name") != TOKEN_ENV:
            continue
        if env.get("value"):
            return LiteralToken(str(env["value"]))
        ref = (env.get("valueFrom") or {}).get("secretKeyRef") or {}
        if ref.get("name") and ref.get("key"):
            return SecretToken(namespace, ref["name"], ref["key"])
    return None


def _env_value(container: dict[str, Any], name: str) -> str | None:
    for env in container.get("env") or []:
        if env.get("name") == name and env.get("value"):
            return str(env["value"])
    return None


def _secret_key(secret: dict[str, Any], relative: str) -> str | None:
    items = secret.get("items")
    if not items:
        return relative  # every key is a file of its own name
    return next((i["key"] for i in items if i.get("path") == relative), None)


def _volume_token(
    pod_spec: dict[str, Any], container: dict[str, Any], path: str, namespace: str
) -> TokenSource | None:
    """The Secret key or the projected ServiceAccount token behind ``path``."""
    for mount in container.get("volumeMounts") or []:
        root = str(mount.get("mountPath") or "").rstrip("/")
        if not root or not path.startswith(root + "/"):
            continue
        relative = posixpath.normpath(path[len(root) + 1 :])
        volume = next(
            (v for v in pod_spec.get("volumes") or [] if v.get("name") == mount.get("name")), None
        )
        if volume is None:
            return None
        if volume.get("secret"):
            key = _secret_key(volume["secret"], relative)
            name = volume["secret"].get("secretName")
            return SecretToken(namespace, name, key) if key and name else None
        for source in (volume.get("projected") or {}).get("sources") or []:
            sat = source.get("serviceAccountToken")
            if sat and sat.get("path") == relative:
                account = pod_spec.get("serviceAccountName") or "default"
                return AccountToken(namespace, account, sat.get("audience"))
            if source.get("secret"):
                key = _secret_key(source["secret"], relative)
                if key:
                    return SecretToken(namespace, source["secret"]["name"], key)
        return None
    return None


def read_operator(deployment: dict[str, Any]) -> OperatorSetup | None:
    """The epoch service URL and the credential sources an operator Deployment declares, or
    None if it runs no ``mcp-epoch operator``."""
    meta = deployment.get("metadata") or {}
    namespace = meta.get("namespace") or "default"
    pod_spec = ((deployment.get("spec") or {}).get("template") or {}).get("spec") or {}
    container = _operator_container(pod_spec)
    if container is None:
        return None
    flags = _flags(list(container.get("args") or []))
    url = flags.get(URL_FLAG) or _env_value(container, URL_ENV)
    tokens: list[TokenSource] = []
    path = flags.get(TOKEN_FILE_FLAG)
    if path:
        tokens.append(FileToken(path))
        behind = _volume_token(pod_spec, container, path, namespace)
        if behind is not None:
            tokens.append(behind)
    env_token = _env_token(container, namespace)
    if env_token is not None:
        tokens.append(env_token)
    return OperatorSetup(namespace, meta.get("name", ""), url, tuple(tokens), flags.get(CA_FLAG))


def port_forward_hint(url: str) -> str | None:
    """For a cluster-internal URL (``http://<svc>.<ns>.svc[.cluster.local]:<port>``), the
    ``kubectl port-forward`` that reaches it from outside the cluster, and the URL to pass."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    labels = host.split(".")
    if len(labels) < 3 or labels[2] != "svc":
        return None
    port = parts.port or (443 if parts.scheme == "https" else 80)
    local = f"{parts.scheme}://127.0.0.1:{port}"
    return (
        f"from outside the cluster, run `kubectl -n {labels[1]} port-forward svc/{labels[0]} "
        f"{port}:{port}` and pass --epoch-service-url {local}, or run status in the "
        "operator's pod (`kubectl exec`), where that name resolves"
    )
