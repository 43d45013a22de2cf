"""The ``mcp-epoch`` command. Subcommands import their heavy dependencies lazily, so the
replica library never pulls in the service's."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from typing import Any


def _serve(args: argparse.Namespace) -> int:
    from epochsvc.service.serve import serve

    return serve(host=args.host, port=args.port, log_level=args.log_level)


def _proxy(args: argparse.Namespace) -> int:
    import logging

    import mcp_epoch

    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    app = mcp_epoch.sidecar_app(args.upstream, retry_ms=args.retry_ms)
    mcp_epoch.serve(app, host=args.host, port=args.port, log_level=args.log_level)
    if args.drain_report and app.last_drain is not None:
        import json

        print(json.dumps(app.drain_report()), flush=True)
    return 0


# Subcommands that live in other packages: (module, help). Each module has
# ``add_arguments(parser)`` and ``run(args) -> int`` and imports its heavy dependencies
# (kopf, the MCP SDK) only inside ``run``.
_PLUGINS = {
    "operator": ("mcp_epoch_operator.cli", "run the kopf operator against the current kubeconfig"),
    "demo": ("epochsvc.demo.cli", "the rolling-deploy proof: naive fleet vs mcp-epoch fleet"),
    "status": (
        "mcp_epoch_operator.status_cmd.cli",
        "one server's pods, epochs, ledger, request-state ring, handoffs and problems",
    ),
}
#: What the kubectl plugin (``kubectl-mcp_epoch``, run as ``kubectl mcp-epoch``) offers: the
#: commands that read a cluster, not the ones that run a component.
_KUBECTL_COMMANDS = ("status",)


def _plugin(name: str) -> Any:
    return importlib.import_module(_PLUGINS[name][0])


def _add_plugins(sub: Any, names: Sequence[str]) -> None:
    for name in names:
        help_text = _PLUGINS[name][1]
        try:
            module = _plugin(name)
        except ModuleNotFoundError as exc:
            if exc.name and _PLUGINS[name][0].startswith(exc.name):
                continue  # that part is not installed
            raise
        sub_parser = sub.add_parser(name, help=help_text, description=help_text)
        module.add_arguments(sub_parser)
        sub_parser.set_defaults(func=module.run)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mcp-epoch", description="Epoch-safe MCP resumption on Kubernetes."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    serve = sub.add_parser(
        "serve",
        help="run the epoch service",
        description="Run the epoch service. Settings come from EPOCHSVC_* environment "
        "variables (EPOCHSVC_DATABASE_URL, EPOCHSVC_OPERATOR_TOKEN, EPOCHSVC_REPLICA_TOKEN, ...).",
    )
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on")
    serve.add_argument("--port", type=int, default=8080, help="port (0: pick a free one)")
    serve.add_argument("--log-level", default=None, help="overrides EPOCHSVC_LOG_LEVEL")
    serve.set_defaults(func=_serve)
    proxy = sub.add_parser(
        "proxy",
        help="the sidecar: epoch-safe resumption for any MCP server on this pod",
        description="Serve the Streamable HTTP MCP server at --upstream (on this pod, any "
        "language, no change) with everything the mcp_epoch library gives an SDK server: "
        "epoch-tagged event IDs, exact resumption, forwarding, drain and session handoff. "
        "Settings come from the MCP_EPOCH_* environment the operator injects; on SIGTERM it "
        "drains. See docs/sidecar.md.",
    )
    proxy.add_argument(
        "--upstream", required=True, help="host:port of the MCP server, e.g. 127.0.0.1:3000"
    )
    proxy.add_argument("--host", default="0.0.0.0", help="address to listen on")
    proxy.add_argument("--port", type=int, default=8000, help="port to serve clients on")
    proxy.add_argument(
        "--retry-ms",
        type=int,
        default=1000,
        help="the SSE retry suggested to clients (ms); the SDK clients reconnect twice",
    )
    proxy.add_argument("--log-level", default="warning", help="debug, info, warning, error")
    proxy.add_argument(
        "--drain-report",
        action="store_true",
        help="on exit, print what the drain did as one JSON line on stdout (for a supervisor)",
    )
    proxy.set_defaults(func=_proxy)
    _add_plugins(sub, list(_PLUGINS))
    return parser


def build_kubectl_parser() -> argparse.ArgumentParser:
    """The kubectl plugin's commands; kubectl passes every argument after ``mcp-epoch`` on,
    ``-n``, ``--context`` and ``--kubeconfig`` included."""
    parser = argparse.ArgumentParser(
        prog="kubectl mcp-epoch", description="mcp-epoch on this cluster (a kubectl plugin)."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_plugins(sub, _KUBECTL_COMMANDS)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    result: int = args.func(args)
    return result


def kubectl_main(argv: Sequence[str] | None = None) -> int:
    """``kubectl-mcp_epoch``: kubectl finds it on PATH and runs it as ``kubectl mcp-epoch``."""
    args = build_kubectl_parser().parse_args(argv)
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
