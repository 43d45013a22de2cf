"""``mcp-epoch operator``: run the kopf operator against the current kubeconfig (or in-cluster
service account).

Imports nothing heavy at import time (``epochsvc.cli`` builds its parser from this module even
when only the epoch service is used); kopf is imported inside ``run``.

Flags (environment fallbacks in brackets)::

  scope
    --all-namespaces                 watch every namespace (the default)
    --namespace NS                   watch only NS (repeatable)
    --operator-namespace NS          the operator's own namespace, never subject to the webhook
                                     [POD_NAMESPACE, else mcp-epoch-system]
  epoch service
    --epoch-service-url URL          how the operator reaches it [MCP_EPOCH_SERVICE_URL]
    --replica-epoch-service-url URL  how replicas reach it; injected as MCP_EPOCH_SERVICE_URL
                                     (default: --epoch-service-url)
    --operator-token-file F          file holding the operator's credential, re-read before
                                     every call (in a cluster: its projected ServiceAccount
                                     token) [MCP_EPOCH_OPERATOR_TOKEN holds a static token]
    --epoch-service-ca F             CA bundle for an https epoch service
    --token-audience AUD             every managed pod gets its own projected ServiceAccount
                                     token for this audience, as MCP_EPOCH_SERVICE_TOKEN_FILE
                                     (default mcp-epoch) [MCP_EPOCH_TOKEN_AUDIENCE]
    --replica-token-secret NAME      static tokens only (an epoch service outside a cluster):
                                     Secret in each server's namespace whose key holds the
                                     replica token, injected as MCP_EPOCH_SERVICE_TOKEN via
                                     secretKeyRef instead of a projected token; an McpServer's
                                     spec.epochService.tokenSecretRef overrides it
                                     [MCP_EPOCH_REPLICA_TOKEN_SECRET]
    --replica-token-secret-key KEY   key in that Secret (default: token)
  admission webhook (omit --webhook-port to serve no webhook)
    --webhook-host ADDR              listen address (default 127.0.0.1; 0.0.0.0 in a pod)
    --webhook-port N                 HTTPS port
    --webhook-share-port             several operator processes on one host serve the same
                                     port (the kernel spreads connections over them)
    --webhook-cert F, --webhook-key F  serving certificate and key (re-read when they change)
    --webhook-ca F                   CA bundle for the registered configuration
    --register-webhook               create/update the MutatingWebhookConfiguration pointing at
                                     https://<advertise host>:<port>/inject-epoch (local runs
                                     only; in a cluster the chart owns the configuration)
    --webhook-advertise-host HOST    address the API server dials (default: --webhook-host)
    --webhook-peer-address HOST:PORT where the other operator processes forward admissions
                                     while this one holds the admission lease; with
                                     --webhook-share-port, an address of this process alone
                                     [POD_IP with the webhook port; else the listen address]
    --admission-lease NAME           Lease in the operator namespace whose holder hands out
                                     pod epochs (default mcp-epoch-operator-admission)
    --admission-lease-seconds S      its duration (default 4): how long admissions wait for
                                     a new holder after one is lost without releasing it
    --epoch-pool-size N              pod epochs per server issued ahead of admissions
                                     (default 8)
    --epoch-pool-max-age S           how long one is kept unused before it is left to be
                                     abandoned (default 300; keep it well under the epoch
                                     service's pending time limit)
    --webhook-config-name NAME       (default mcp-epoch-operator)
    --webhook-timeout-seconds N      timeoutSeconds of the registered configuration (default 5)
    --exclude-namespace NS           more namespaces the registered configuration skips
  running
    --servers-configmap NAME         ConfigMap in the operator namespace that remembers which
                                     servers have epochs, so a restart resyncs even servers
                                     with nothing left in the cluster
                                     (default mcp-epoch-operator-servers)
    --resync-interval S              full ledger-vs-pods resync period (default 30)
    --rotation-stall-seconds S       a request-state rotation step that waits this long for
                                     the same pods is reported stalled (default 60)
    --health-endpoint URL            kopf liveness endpoint, e.g. http://0.0.0.0:8081/healthz
    --metrics-port PORT              Prometheus /metrics (webhook latency, reconciles, epoch
                                     service calls and retries)
    --verbose
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path

from mcp_epoch.contract import TOKEN_AUDIENCE


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare the flags listed in the module docstring."""
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument("--all-namespaces", action="store_true", help="watch every namespace")
    scope.add_argument(
        "--namespace", action="append", metavar="NS", help="watch only NS (repeatable)"
    )
    parser.add_argument(
        "--operator-namespace",
        default=os.environ.get("POD_NAMESPACE", "mcp-epoch-system"),
        help="the operator's own namespace, excluded from the webhook",
    )
    parser.add_argument(
        "--epoch-service-url",
        default=os.environ.get("MCP_EPOCH_SERVICE_URL"),
        help="epoch service URL as the operator reaches it [MCP_EPOCH_SERVICE_URL]",
    )
    parser.add_argument(
        "--replica-epoch-service-url",
        default=None,
        help="epoch service URL injected into pods (default: --epoch-service-url)",
    )
    parser.add_argument(
        "--operator-token-file",
        type=Path,
        help="file with the operator token (else env MCP_EPOCH_OPERATOR_TOKEN)",
    )
    parser.add_argument("--epoch-service-ca", type=Path, help="CA bundle for an https service")
    parser.add_argument(
        "--replica-token-secret",
        default=os.environ.get("MCP_EPOCH_REPLICA_TOKEN_SECRET"),
        help="default Secret name holding the replica token, per server namespace",
    )
    parser.add_argument("--replica-token-secret-key", default="token")
    parser.add_argument(
        "--token-audience",
        default=os.environ.get("MCP_EPOCH_TOKEN_AUDIENCE", TOKEN_AUDIENCE),
        help="audience of the projected token mounted into every managed pod, unless "
        "--replica-token-secret is given [MCP_EPOCH_TOKEN_AUDIENCE]",
    )
    parser.add_argument("--webhook-host", default="127.0.0.1", help="webhook listen address")
    parser.add_argument("--webhook-port", type=int, help="webhook HTTPS port (none: no webhook)")
    parser.add_argument(
        "--webhook-share-port",
        action="store_true",
        help="let other operator processes on this host serve the same webhook port",
    )
    parser.add_argument("--webhook-cert", type=Path, help="webhook serving certificate (PEM)")
    parser.add_argument("--webhook-key", type=Path, help="webhook serving key (PEM)")
    parser.add_argument("--webhook-ca", type=Path, help="CA bundle for the registered config")
    parser.add_argument(
        "--register-webhook",
        action="store_true",
        help="create/update the MutatingWebhookConfiguration (local runs)",
    )
    parser.add_argument("--webhook-advertise-host", help="address the API server dials")
    parser.add_argument("--webhook-peer-address", metavar="HOST:PORT")
    parser.add_argument("--admission-lease", default="mcp-epoch-operator-admission")
    parser.add_argument("--admission-lease-seconds", type=float, default=4.0)
    parser.add_argument("--epoch-pool-size", type=int, default=8)
    parser.add_argument("--epoch-pool-max-age", type=float, default=300.0)
    parser.add_argument("--webhook-config-name", default="mcp-epoch-operator")
    parser.add_argument("--webhook-timeout-seconds", type=int, default=5)
    parser.add_argument("--exclude-namespace", action="append", default=[], metavar="NS")
    parser.add_argument(
        "--servers-configmap",
        default="mcp-epoch-operator-servers",
        help="ConfigMap in the operator namespace remembering servers with epochs",
    )
    parser.add_argument(
        "--sidecar-image",
        help="the mcp-epoch image whose `mcp-epoch proxy` is injected into pods that choose "
        "the sidecar (annotation mcp.epochs.dev/data-plane: sidecar); none: such pods are "
        "refused",
    )
    parser.add_argument("--resync-interval", type=float, default=30.0)
    parser.add_argument("--rotation-stall-seconds", type=float, default=60.0)
    parser.add_argument("--health-endpoint", help="e.g. http://0.0.0.0:8081/healthz")
    parser.add_argument(
        "--metrics-port", type=int, help="serve Prometheus /metrics on this port (all addresses)"
    )
    parser.add_argument("--verbose", action="store_true")


def _pod_address(port: int) -> str | None:
    """``POD_IP:port`` in a pod (an IPv6 address in brackets), else None."""
    ip = os.environ.get("POD_IP", "").strip()
    if not ip:
        return None
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


def _fail(message: str) -> int:
    print(f"mcp-epoch operator: {message}", file=sys.stderr)
    return 2


def run(args: argparse.Namespace) -> int:
    """Validate the flags, then hand over to kopf (imported only here)."""
    from mcp_epoch_operator.config import OperatorConfig, WebhookServing
    from mcp_epoch_operator.resources import ReplicaDefaults, TokenSecretRef

    if not args.epoch_service_url:
        return _fail("--epoch-service-url (or MCP_EPOCH_SERVICE_URL) is required")
    from mcp_epoch_operator.epochs import token_from_file

    token: str | Callable[[], str]
    if args.operator_token_file is not None:
        try:
            token = token_from_file(args.operator_token_file)
        except OSError as exc:
            return _fail(f"cannot read --operator-token-file: {exc}")
        first = token()
    else:
        token = first = os.environ.get("MCP_EPOCH_OPERATOR_TOKEN", "").strip()
    if not first:
        return _fail(
            "the operator's credential is required: --operator-token-file (in a cluster, its "
            "projected ServiceAccount token) or MCP_EPOCH_OPERATOR_TOKEN"
        )

    webhook = None
    if args.webhook_port is not None:
        if args.webhook_cert is None or args.webhook_key is None:
            return _fail("--webhook-port needs --webhook-cert and --webhook-key")
        webhook = WebhookServing(
            listen=args.webhook_host,
            port=args.webhook_port,
            cert=args.webhook_cert,
            key=args.webhook_key,
            ca=args.webhook_ca,
            advertise=args.webhook_advertise_host,
            share_port=args.webhook_share_port,
            peer=args.webhook_peer_address or _pod_address(args.webhook_port),
        )
    elif args.register_webhook:
        return _fail("--register-webhook needs --webhook-port, --webhook-cert and --webhook-key")
    if not args.rotation_stall_seconds > 0:
        return _fail("--rotation-stall-seconds must be more than 0")
    if not args.admission_lease_seconds >= 1:
        return _fail("--admission-lease-seconds must be at least 1")
    if args.epoch_pool_size < 1 or not args.epoch_pool_max_age > 0:
        return _fail("--epoch-pool-size must be at least 1 and --epoch-pool-max-age above 0")

    secret = (
        TokenSecretRef(args.replica_token_secret, args.replica_token_secret_key)
        if args.replica_token_secret
        else None
    )
    config = OperatorConfig(
        namespaces=list(args.namespace) if args.namespace else None,
        epoch_service_url=args.epoch_service_url,
        operator_token=token,
        replica=ReplicaDefaults(
            service_url=args.replica_epoch_service_url or args.epoch_service_url,
            token_secret=secret,
            token_audience=None if secret else args.token_audience,
            sidecar_image=args.sidecar_image,
        ),
        operator_namespace=args.operator_namespace,
        webhook=webhook,
        register_webhook=args.register_webhook,
        webhook_config_name=args.webhook_config_name,
        webhook_timeout_seconds=args.webhook_timeout_seconds,
        excluded_namespaces=list(args.exclude_namespace),
        resync_interval=args.resync_interval,
        rotation_stall_seconds=args.rotation_stall_seconds,
        epoch_service_ca=args.epoch_service_ca,
        health_endpoint=args.health_endpoint,
        metrics_port=args.metrics_port,
        servers_configmap=args.servers_configmap,
        admission_lease=args.admission_lease,
        admission_lease_seconds=args.admission_lease_seconds,
        epoch_pool_size=args.epoch_pool_size,
        epoch_pool_max_age=args.epoch_pool_max_age,
    )
    from mcp_epoch_operator.handlers import run as run_operator

    return run_operator(config, verbose=args.verbose)
