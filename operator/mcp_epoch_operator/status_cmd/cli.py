"""``mcp-epoch status NAME`` and ``kubectl mcp-epoch status NAME``: one server on one screen.

Imports only the standard library at import time: ``epochsvc.cli`` builds its parser from this
module whatever extras are installed, and the reads need the operator extra
(``kubernetes_asyncio``, ``kopf``, ``prometheus-client``), which :func:`run` checks first.

Exit codes (docs/status.md):

- 0: shown, and nothing needs attention (warnings, such as a rollout under way, may be listed);
- 1: shown, with at least one error among the problems (the epoch service unreachable, a
  stalled rotation, an epoch without its pod, ...);
- 2: the command could not run: the operator extra missing, no Kubernetes credentials, a
  flag's file unreadable;
- 3: nothing to show: no McpServer or labelled Deployment of that name, or the API server
  refused or did not answer.
"""

from __future__ import annotations

import argparse
import importlib.util
import shutil
import sys
from pathlib import Path

EXIT_OK = 0
EXIT_PROBLEMS = 1
EXIT_SETUP = 2
EXIT_NOT_FOUND = 3
#: The modules the reads need, all from the operator extra.
NEEDS = ("kubernetes_asyncio", "kopf", "prometheus_client")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "name",
        metavar="NAME",
        help="an McpServer, or a Deployment whose pods carry the mcp.epochs.dev/server label "
        "(mcpserver/NAME or deployment/NAME to say which)",
    )
    parser.add_argument(
        "-n", "--namespace", help="the namespace (default: the kubeconfig context's, else default)"
    )
    parser.add_argument("-o", "--output", choices=("text", "json"), default="text")
    parser.add_argument(
        "--kubeconfig", help="kubeconfig file (default: KUBECONFIG, ~/.kube/config)"
    )
    parser.add_argument("--context", help="kubeconfig context (default: its current context)")
    parser.add_argument(
        "--epoch-service-url",
        help="the epoch service [MCP_EPOCH_SERVICE_URL] (default: the mcp-epoch "
        "operator's --epoch-service-url, read from its Deployment)",
    )
    token = parser.add_mutually_exclusive_group()
    token.add_argument(
        "--token",
        help="the operator's token for the epoch service [MCP_EPOCH_OPERATOR_TOKEN] (default: "
        "read from the operator's Deployment: its token Secret, or a TokenRequest for its "
        "ServiceAccount)",
    )
    token.add_argument("--token-file", type=Path, help="a file holding that token")
    parser.add_argument("--epoch-service-ca", type=Path, help="CA bundle for an https service")
    parser.add_argument(
        "--operator-namespace",
        help="look for the operator's Deployment only in this namespace (default: all)",
    )
    parser.add_argument(
        "--no-metrics",
        action="store_true",
        help="do not read the pods' /metrics through the API server's pod proxy",
    )


def _missing() -> list[str]:
    return [m for m in NEEDS if importlib.util.find_spec(m) is None]


def _width() -> int:
    return shutil.get_terminal_size((100, 24)).columns


def run(args: argparse.Namespace) -> int:
    """Gather, judge, print; the exit code says whether anything needs attention."""
    missing = _missing()
    if missing:
        print(
            f"mcp-epoch status: needs the operator extra (missing: {', '.join(missing)}): "
            "pip install 'mcp-epoch[operator]'",
            file=sys.stderr,
        )
        return EXIT_SETUP
    import asyncio

    from mcp_epoch_operator.kube import KubeError
    from mcp_epoch_operator.status_cmd import gather, model, render

    opts = gather.Options(
        name=args.name,
        namespace=args.namespace,
        kubeconfig=args.kubeconfig,
        context=args.context,
        url=args.epoch_service_url,
        token=args.token,
        token_file=args.token_file,
        ca=args.epoch_service_ca,
        operator_namespace=args.operator_namespace,
        metrics=not args.no_metrics,
    )
    try:
        found = asyncio.run(gather.gather(opts))
    except gather.SetupError as exc:
        print(f"mcp-epoch status: {exc}", file=sys.stderr)
        return EXIT_SETUP
    except gather.NotFound as exc:
        print(f"mcp-epoch status: {exc}", file=sys.stderr)
        return EXIT_NOT_FOUND
    except KubeError as exc:
        print(f"mcp-epoch status: the Kubernetes API refused or failed: {exc}", file=sys.stderr)
        return EXIT_NOT_FOUND
    status = model.build(found)
    if args.output == "json":
        print(render.as_json(status))
    else:
        print(render.as_text(status, _width()))
    return EXIT_OK if status["healthy"] else EXIT_PROBLEMS
