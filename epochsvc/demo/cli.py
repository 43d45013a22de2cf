"""``mcp-epoch demo``: the rolling-deploy proof, run as local processes.

This module is imported whenever ``mcp-epoch`` builds its parser, so it imports nothing heavy
at module level: the MCP SDK, uvicorn and the scenario load inside :func:`run`.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
import warnings
from dataclasses import asdict
from pathlib import Path
from typing import Any

EPILOG = (
    "Fleets: naive (counter IDs, adopts unknown sessions), sticky (the SDK with its example "
    "in-memory store behind session affinity, plain SDK clients), plain (mcp-epoch servers, "
    "plain SDK clients), epoch (mcp-epoch servers and EpochClient), sidecar (TypeScript SDK "
    "servers behind the mcp-epoch sidecar, EpochClient). Exit status 0 when every fleet that "
    "ran meets its targets (see docs/demo.md); 1 otherwise."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = EPILOG
    parser.add_argument("--clients", type=int, default=50, help="MCP clients (default 50)")
    parser.add_argument("--replicas", type=int, default=3, help="replicas per fleet (default 3)")
    parser.add_argument(
        "--duration",
        type=float,
        default=22.0,
        help="seconds of traffic per fleet, rolling deploy included (default 22)",
    )
    parser.add_argument("--seed", type=int, default=7, help="seed of the random drops")
    parser.add_argument(
        "--drop-every",
        type=float,
        default=8.0,
        help="mean seconds between random drops of one client's connections (default 8)",
    )
    parser.add_argument(
        "--lb",
        choices=("link", "request"),
        default="link",
        help="round-robin per client connection (default) or per request",
    )
    parser.add_argument(
        "--fleets",
        default="naive,sticky,plain,epoch,sidecar",
        help="which fleets to run, in order (default naive,sticky,plain,epoch,sidecar; "
        "sidecar needs Node.js 20 or later and npm)",
    )
    parser.add_argument(
        "--no-deploy",
        action="store_true",
        help="the same traffic and drops without a rolling deploy (a baseline)",
    )
    parser.add_argument("--json", metavar="PATH", help="write the summary as JSON (- for stdout)")
    parser.add_argument(
        "--workdir", type=Path, help="keep ledger and process logs here (default: a temp dir)"
    )
    parser.add_argument(
        "--report",
        metavar="DIR",
        type=Path,
        help="write the timeline of every fleet (PNGs) and one self-contained HTML page with "
        "them and the table into DIR (needs matplotlib: pip install 'mcp-epoch[report]')",
    )


def _config(args: argparse.Namespace) -> Any:
    from epochsvc.demo.client import CallShape
    from epochsvc.demo.scenario import ScenarioConfig

    warm = min(5.0, args.duration / 4)
    return ScenarioConfig(
        clients=args.clients,
        replicas=args.replicas,
        duration=args.duration,
        seed=args.seed,
        drop_every=args.drop_every,
        warm=warm,
        policy=args.lb,
        deploy=not args.no_deploy,
        shape=CallShape(),
    )


def run(args: argparse.Namespace) -> int:
    import asyncio
    import logging

    from epochsvc.demo import report
    from epochsvc.demo.fleet import EPOCH_KINDS
    from epochsvc.demo.scenario import FLEETS, FleetName, FleetResult, local_driver, run_fleet
    from epochsvc.demo.service import EpochService

    names = [f.strip() for f in str(args.fleets).split(",") if f.strip()]
    fleets: list[FleetName] = [f for f in FLEETS if f in names]
    fleets.sort(key=names.index)
    if not fleets or len(fleets) != len(names):
        print(f"mcp-epoch demo: --fleets takes some of {', '.join(FLEETS)}", file=sys.stderr)
        return 2
    if args.clients < 1 or args.replicas < 1 or args.duration <= 0:
        print("mcp-epoch demo: clients, replicas and duration must be positive", file=sys.stderr)
        return 2
    if args.report is not None:
        from epochsvc.demo.report_page import ReportUnavailable, require_plotting

        try:
            require_plotting()  # before minutes of fleets, not after
        except ReportUnavailable as exc:
            print(f"mcp-epoch demo: {exc}", file=sys.stderr)
            return 2
    # The SDK logs every reconnect at INFO; the demo reports its own figures instead.
    warnings.filterwarnings("ignore", message=".*removed as of 2026-07-28")
    logging.basicConfig(level=logging.ERROR)
    logging.getLogger("mcp").setLevel(logging.CRITICAL)
    logging.getLogger("epochsvc").setLevel(logging.CRITICAL)
    cfg = _config(args)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="mcp-epoch-demo-"))
    workdir.mkdir(parents=True, exist_ok=True)
    # Progress goes to stderr when the summary goes to stdout, so `--json -` stays parseable.
    out = sys.stderr if args.json == "-" else sys.stdout

    def log(line: str) -> None:
        print(line, file=out, flush=True)

    t0 = time.monotonic()
    log(
        f"mcp-epoch demo: {cfg.clients} clients, {cfg.replicas} replicas, ~{cfg.duration:g}s "
        f"of traffic per fleet, seed {cfg.seed}"
    )
    needs_service = any(FLEETS[f].servers in EPOCH_KINDS for f in fleets)
    service = EpochService(workdir) if needs_service else None
    results: list[FleetResult] = []
    try:
        if service is not None:
            service.start()
            log(f"epoch service: {service.url} (SQLite ledger in {workdir})")
        factory = local_driver(workdir, service, cfg.buffer_events, log)
        for kind in fleets:
            log(f"[{FLEETS[kind].title}]")
            dump = workdir / f"calls-{kind}.jsonl" if args.workdir else None
            results.append(asyncio.run(run_fleet(kind, cfg, factory, log, dump)))
    except KeyboardInterrupt:
        return 130
    finally:
        if service is not None:
            service.stop()
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    failed = report.verdict(results)
    log("")
    log(report.table(results))
    log("")
    if failed:
        for line in failed:
            log(f"FAILED: {line}")
        if args.workdir is None:
            log(
                "(run with --workdir DIR to keep every call that went wrong, with what it "
                "accepted, and each replica's log: a run's timing is not set by its seed)"
            )
    else:
        log("OK: " + report.success_line({f.kind for f in results}))
    if args.report is not None:
        from epochsvc.demo.report_page import write_report

        setup = (
            f"{cfg.clients} clients, {cfg.replicas} replicas per fleet, ~{cfg.duration:g}s of "
            f"traffic per fleet, {cfg.policy} routing, random drops every ~{cfg.drop_every:g}s "
            f"per client, seed {cfg.seed}" + ("" if cfg.deploy else ", no deploy (baseline)")
        )
        page = write_report(args.report, results, failed, setup)
        log(f"report: {page.resolve()}")
    log(f"total {time.monotonic() - t0:.1f}s")
    if args.json:
        config = {**asdict(cfg), "fleets": fleets}
        text = json.dumps(report.summary(results, config, failed), indent=2)
        if args.json == "-":
            print(text, flush=True)
        else:
            Path(args.json).write_text(text + "\n")
    return 1 if failed else 0
