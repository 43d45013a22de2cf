"""``python -m tools.image build``: what ``make image`` runs."""

from __future__ import annotations

import argparse
import sys

from tools.image import build, rootfs
from tools.image.chroot import EngineError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.image")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("build", help="build the Dockerfile into dist/mcp-epoch-<version>.oci.tar")
    sub.add_parser("roots", help="make the cached tool root and base stand-in only")
    args = parser.parse_args(argv)
    try:
        if args.command == "roots":
            for spec in (rootfs.TOOLS, rootfs.BASE):
                print(rootfs.ensure(spec))
        else:
            build.build()
    except (rootfs.RootfsError, EngineError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
