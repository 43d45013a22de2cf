"""The ``mcp-epoch`` command. Subcommands import their heavy dependencies lazily, so the
replica library never pulls in the service's."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def _serve(args: argparse.Namespace) -> int:
    from epochsvc.service.serve import serve

    return serve(host=args.host, port=args.port, log_level=args.log_level)


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
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
