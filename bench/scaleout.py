"""Whether a benchmark runs its scale-out figures: the epoch service as two processes on one
PostgreSQL, reported beside one (``docs/scaling.md`` reads them; no target judges them).

A full run has them. ``--quick`` leaves them out unless asked: each needs a PostgreSQL and two
more service processes started and stopped (10 to 12 s of a quick run's 3 minutes in each of
``longpoll`` and ``service``), for figures a quick look does not judge.
"""

from __future__ import annotations

import argparse

SKIPPED = "scale-out on PostgreSQL: not measured in --quick (add --scale-out for it)"


def add_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--scale-out",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="the two-process run on PostgreSQL (default: in a full run, not in --quick)",
    )


def wanted(args: argparse.Namespace) -> bool:
    return not args.quick if args.scale_out is None else bool(args.scale_out)
