"""Every read of ``mcp-epoch status``: the API server (through the admin's kubeconfig, or the
pod's ServiceAccount inside a cluster), the epoch service (with the operator's credential) and
each pod's ``/metrics`` (through the API server's pod proxy, so nothing but the kubeconfig is
needed to reach a pod).

The API server is read with the operator's own client (:class:`~mcp_epoch_operator.kube.
KubeClient`: plain JSON, a 401 logs in again), logged in with ``kubernetes_asyncio``'s
kubeconfig loader instead of kopf's, because that one honours ``--context`` and the exec and
auth-provider plugins an admin's kubeconfig uses. The ledger is read before the pods, as the
operator's resync does: an epoch bound to a pod the later list lacks is really without a pod.
"""

from __future__ import annotations

import asyncio
import base64
import os
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.config.config_exception import ConfigException
from prometheus_client.parser import text_string_to_metric_families

from mcp_epoch import api
from mcp_epoch.api_client import (
    EpochServiceClient,
    EpochServiceError,
    EpochServiceUnavailable,
    RetryPolicy,
)
from mcp_epoch.contract import METRICS_PATH
from mcp_epoch_operator.kube import KubeClient, KubeError
from mcp_epoch_operator.lifecycle import address_of
from mcp_epoch_operator.names import EPOCH_ANNOTATION, SERVER_LABEL
from mcp_epoch_operator.status_cmd import locate
from mcp_epoch_operator.status_cmd.model import Gathered, PodMetrics, ServiceRead, server_of

T = TypeVar("T")

#: One look, not a wait: a status that hangs on an outage tells nobody anything.
SERVICE_POLICY = RetryPolicy(deadline=2.0, attempt_timeout=3.0, first_backoff=0.2)
#: Each pod's /metrics through the API server's proxy.
METRICS_TIMEOUT = 3.0
#: Lifetime asked of a minted operator token (the API server's minimum is 10 minutes).
TOKEN_SECONDS = 600


class SetupError(Exception):
    """The command cannot run as asked (no kubeconfig, a bad flag value)."""


class NotFound(Exception):
    """Neither an McpServer nor a labelled Deployment of that name."""


@dataclass(frozen=True, slots=True)
class Options:
    """What the flags asked for (``None``: find it)."""

    name: str
    namespace: str | None = None
    kubeconfig: str | None = None
    context: str | None = None
    url: str | None = None
    token: str | None = None
    token_file: Path | None = None
    ca: Path | None = None
    operator_namespace: str | None = None
    metrics: bool = True


class StatusKube(KubeClient):
    """The operator's API client, logged in from a kubeconfig (``--kubeconfig``,
    ``--context``) or the pod's ServiceAccount, with the few reads only status makes."""

    def __init__(self, configuration: client.Configuration, namespace: str | None) -> None:
        self._configuration = configuration
        self._namespace = namespace
        super().__init__(lambda: None)

    def _connect(self) -> None:
        self.default_namespace = self._namespace
        self._api = client.ApiClient(self._configuration)
        self._api.user_agent = "mcp-epoch-status"
        self.core = client.CoreV1Api(self._api)
        self.apps = client.AppsV1Api(self._api)
        self.custom = client.CustomObjectsApi(self._api)

    async def list_deployments(self, namespace: str | None, selector: str) -> list[Any]:
        if namespace:
            return await self._list(
                self.apps.list_namespaced_deployment, namespace=namespace, label_selector=selector
            )
        return await self._list(
            self.apps.list_deployment_for_all_namespaces, label_selector=selector
        )

    async def get_secret(self, namespace: str, name: str) -> dict[str, Any] | None:
        return await self._get(
            lambda: self.core.read_namespaced_secret(name, namespace, _preload_content=False)
        )

    async def mint_token(self, namespace: str, account: str, audience: str | None) -> str:
        """A TokenRequest for ``account`` (``kubectl create token``)."""
        spec: dict[str, Any] = {"expirationSeconds": TOKEN_SECONDS}
        if audience:
            spec["audiences"] = [audience]
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}
        answer = await self._call(
            lambda: self.core.create_namespaced_service_account_token(
                account, namespace, body, _preload_content=False
            )
        )
        return str((answer.get("status") or {}).get("token") or "")

    async def pod_proxy_text(self, namespace: str, pod: str, port: int, path: str) -> str:
        """``GET /api/v1/namespaces/{ns}/pods/{pod}:{port}/proxy/{path}`` as text."""
        try:
            response = await self.core.connect_get_namespaced_pod_proxy_with_path(
                f"{pod}:{port}", namespace, path.lstrip("/"), _preload_content=False
            )
        except ApiException as exc:
            raise KubeError(int(exc.status or 0), exc.body) from None
        try:
            raw = await response.read()
        finally:
            response.release()
        if not 200 <= response.status <= 299:
            raise KubeError(response.status, raw.decode(errors="replace")[:300])
        return str(raw.decode(errors="replace"))


def _kubeconfig(opts: Options) -> str | None:
    """The kubeconfig to read, as kubectl picks it; None: none, so the pod's ServiceAccount."""
    path = opts.kubeconfig or os.environ.get("KUBECONFIG")
    default = Path("~/.kube/config").expanduser()
    if path:
        return path
    if default.exists() or opts.context:
        return str(default)
    return None


def _read_token(path: str | Path) -> str:
    return Path(path).read_text().strip()


def _exists(path: str) -> bool:
    return Path(path).exists()


async def connect(opts: Options) -> tuple[StatusKube, str]:
    """The API client and the namespace to look in (the flag, else the context's, else
    ``default``)."""
    conf = client.Configuration()
    namespace = opts.namespace
    path = _kubeconfig(opts)
    try:
        if path:
            loader = await config.load_kube_config(
                config_file=path,
                context=opts.context,
                client_configuration=conf,
                persist_config=False,
            )
            context = (loader.current_context or {}).get("context") or {}
            namespace = namespace or context.get("namespace")
        else:
            config.load_incluster_config(client_configuration=conf)
    except (ConfigException, OSError) as exc:
        raise SetupError(
            f"no Kubernetes credentials: {exc} (pass --kubeconfig, set KUBECONFIG, or run "
            "inside a pod)"
        ) from None
    return StatusKube(conf, namespace), namespace or "default"


async def find_server(
    kube: StatusKube, ns: str, name: str
) -> tuple[str, str, dict[str, Any] | None, dict[str, Any] | None]:
    """(kind, server, McpServer, Deployment) for ``name``: an McpServer, else a Deployment
    whose pod template carries the server label. ``kind/name`` picks one."""
    kind, _, bare = name.rpartition("/")
    kind = kind.lower()
    if kind in ("", "mcpserver", "mcpservers", "mcps", "mcpserver.mcp.epochs.dev"):
        mcps = await kube.get_mcpserver(ns, bare)
        if mcps is not None:
            return "McpServer", bare, mcps, await kube.get_deployment(ns, bare)
        if kind:
            raise NotFound(f'McpServer "{bare}" not found in namespace {ns}')
    if kind in ("", "deployment", "deployments", "deploy", "deployment.apps"):
        deployment = await kube.get_deployment(ns, bare)
        if deployment is not None:
            server = server_of(deployment)
            if server is None:
                raise NotFound(
                    f"Deployment {ns}/{bare} has no {SERVER_LABEL} label on its pod template: "
                    "mcp-epoch does not manage its pods"
                )
            return "Deployment", server, None, deployment
        raise NotFound(
            f'neither an McpServer nor a Deployment "{bare}" in namespace {ns} (use -n for '
            "another namespace)"
        )
    raise NotFound(f"{kind}/{bare}: status shows an McpServer or a Deployment")


@dataclass
class _Credential:
    url: str | None = None
    url_source: str = ""
    token: str | None = None
    token_source: str = ""
    ca: str | None = None
    operator: str | None = None
    notes: tuple[str, ...] = ()


async def _operator_setup(
    kube: StatusKube, namespace: str | None
) -> tuple[locate.OperatorSetup | None, str]:
    """The mcp-epoch operator's Deployment, read by the chart's labels."""
    try:
        found = await kube.list_deployments(namespace, locate.OPERATOR_SELECTOR)
    except KubeError as exc:
        return None, f"could not list the operator's Deployment: {exc}"
    setups = [s for s in map(locate.read_operator, found) if s is not None]
    where = f"namespace {namespace}" if namespace else "any namespace"
    if not setups:
        return None, (
            f"no Deployment labelled {locate.OPERATOR_SELECTOR} runs `mcp-epoch operator` "
            f"in {where}"
        )
    setups.sort(key=lambda s: (s.url is None, s.namespace, s.deployment))
    return setups[0], ""


async def _token_from(kube: StatusKube, source: locate.TokenSource) -> str:
    if isinstance(source, locate.FileToken):
        return _read_token(source.path)
    if isinstance(source, locate.LiteralToken):
        return source.value
    if isinstance(source, locate.SecretToken):
        secret = await kube.get_secret(source.namespace, source.name)
        value = ((secret or {}).get("data") or {}).get(source.key)
        if not value:
            raise KubeError(404, f"Secret {source.namespace}/{source.name} has no {source.key}")
        return base64.b64decode(value).decode().strip()
    return await kube.mint_token(source.namespace, source.service_account, source.audience)


async def credential(kube: StatusKube, opts: Options) -> _Credential:
    """The service URL and the operator's credential: flags and environment first, then the
    operator's Deployment (its Secret, or a TokenRequest for its ServiceAccount)."""
    cred = _Credential(ca=str(opts.ca) if opts.ca else None)
    if opts.url:
        cred.url, cred.url_source = opts.url, "--epoch-service-url"
    elif os.environ.get(locate.URL_ENV):
        cred.url, cred.url_source = os.environ[locate.URL_ENV], locate.URL_ENV
    if opts.token:
        cred.token, cred.token_source = opts.token, "--token"
    elif opts.token_file is not None:
        try:
            cred.token = _read_token(opts.token_file)
        except OSError as exc:
            raise SetupError(f"cannot read --token-file: {exc}") from None
        cred.token_source = f"--token-file {opts.token_file}"
    elif os.environ.get(locate.TOKEN_ENV):
        cred.token, cred.token_source = os.environ[locate.TOKEN_ENV].strip(), locate.TOKEN_ENV
    if cred.url and cred.token:
        return cred

    setup, why = await _operator_setup(kube, opts.operator_namespace)
    if setup is None:
        cred.notes += (why,)
        return cred
    cred.operator = f"{setup.namespace}/{setup.deployment}"
    if not cred.url and setup.url:
        cred.url, cred.url_source = setup.url, setup.describe()
        cred.ca = cred.ca or setup.ca
    if cred.token:
        return cred
    for source in setup.tokens:
        if isinstance(source, locate.FileToken) and not _exists(source.path):
            continue  # a path in the operator's container: only there when run in its pod
        try:
            cred.token = await _token_from(kube, source)
        except (KubeError, OSError, ValueError) as exc:
            cred.notes += (f"{source.describe()}: {exc}",)
            continue
        if cred.token:
            cred.token_source = source.describe()
            return cred
    if not setup.tokens:
        cred.notes += (f"{setup.describe()} names no operator token",)
    return cred


async def read_service(cred: _Credential, ns: str, server: str) -> ServiceRead:
    """The ledger of the server, then its ring."""
    if not cred.url:
        return ServiceRead(None, unreachable="; ".join(cred.notes) or None)
    verify: Any = ssl.create_default_context(cafile=cred.ca) if cred.ca else True
    base = ServiceRead(cred.url, cred.url_source, cred.token_source)
    async with EpochServiceClient(
        cred.url, cred.token, policy=SERVICE_POLICY, user_agent="mcp-epoch-status", verify=verify
    ) as svc:
        try:
            ledger = await svc.send(api.list_server(ns, server))
        except EpochServiceUnavailable as exc:
            hint = locate.port_forward_hint(cred.url)
            return replace(base, unreachable=str(exc) or "no answer", hint=hint)
        except EpochServiceError as exc:
            why = str(exc)
            if cred.notes or not cred.token:
                why += " (no operator credential: " + ("; ".join(cred.notes) or "none given") + ")"
            return replace(base, refused=why)
        ring: dict[str, Any] | None = None
        ring_error = None
        try:
            ring = (await svc.send(api.ring_status(ns, server))).model_dump(mode="json")
        except (EpochServiceUnavailable, EpochServiceError) as exc:
            ring_error = str(exc)
    return replace(base, ledger=ledger.model_dump(mode="json"), ring=ring, ring_error=ring_error)


def parse_metrics(text: str) -> dict[str, float]:
    """The unlabelled samples of a Prometheus text exposition, by name."""
    return {
        sample.name: float(sample.value)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if not sample.labels
    }


async def pod_metrics(
    kube: StatusKube, ns: str, pods: list[dict[str, Any]], ledger: dict[str, Any] | None
) -> dict[str, PodMetrics]:
    """Each running pod's ``/metrics`` through the API server, concurrently, each within
    :data:`METRICS_TIMEOUT`; a pod that does not answer says why instead."""
    addresses = {e["epoch"]: e.get("address") for e in (ledger or {}).get("epochs") or []}

    async def one(pod: dict[str, Any]) -> tuple[str, PodMetrics]:
        meta = pod.get("metadata") or {}
        epoch = (meta.get("annotations") or {}).get(EPOCH_ANNOTATION) or ""
        address = addresses.get(epoch) or address_of(pod)
        name = str(meta.get("name"))
        if not address:
            return name, PodMetrics(error="no address yet")
        port = int(address.rsplit(":", 1)[1])
        try:
            text = await asyncio.wait_for(
                kube.pod_proxy_text(ns, name, port, METRICS_PATH), METRICS_TIMEOUT
            )
        except TimeoutError:
            return name, PodMetrics(error=f"no answer within {METRICS_TIMEOUT:g}s")
        except (KubeError, OSError) as exc:
            return name, PodMetrics(error=str(exc).splitlines()[0][:200])
        try:
            return name, PodMetrics(parse_metrics(text))
        except ValueError as exc:
            return name, PodMetrics(error=f"not Prometheus text: {exc}")

    running = [p for p in pods if (p.get("status") or {}).get("phase") == "Running"]
    return dict(await asyncio.gather(*(one(p) for p in running)))


async def gather(opts: Options, clock: Callable[[], float] = time.time) -> Gathered:
    """Everything about one server, read once."""
    kube, ns = await connect(opts)
    try:
        kind, server, mcps, deployment = await _kube_step(lambda: find_server(kube, ns, opts.name))
        cred = await credential(kube, opts)
        service = await read_service(cred, ns, server)
        pods = await _kube_step(lambda: kube.list_pods(ns, f"{SERVER_LABEL}={server}"))
        metrics = await pod_metrics(kube, ns, pods, service.ledger) if opts.metrics else {}
    finally:
        await kube.aclose()
    return Gathered(
        namespace=ns,
        server=server,
        kind="McpServer" if kind == "McpServer" else "Deployment",
        mcpserver=mcps,
        deployment=deployment,
        pods=pods,
        service=service,
        now=clock(),
        metrics=metrics,
        operator=cred.operator,
    )


async def _kube_step(step: Callable[[], Awaitable[T]]) -> T:
    """An API server read whose transport failure is a :class:`KubeError` like a refusal."""
    try:
        return await step()
    except (OSError, TimeoutError) as exc:
        raise KubeError(0, f"the API server does not answer: {exc}") from None
