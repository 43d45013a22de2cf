"""Command line for humans.

python -m tests.cluster build [COMPONENT...] [--prune]   build missing binaries
python -m tests.cluster gomod [COMPONENT...]             regenerate toolchain go.mod/go.sum
python -m tests.cluster up [--nodes N]                   start a cluster that outlives the command
python -m tests.cluster down                             stop it (by the PIDs it recorded)
python -m tests.cluster status | logs [COMPONENT...]     inspect it
python -m tests.cluster env                              print export lines (PATH, KUBECONFIG)
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from tests.cluster import build, harness


def _default_run_dir() -> Path:
    """Where ``up`` keeps its cluster, so ``down`` finds it without arguments."""
    return build.cache_root() / "cluster"


def _cmd_gomod(args: argparse.Namespace) -> int:
    for comp in build.components():
        if not args.components or comp.name in args.components:
            build.regenerate_gomod(comp)
    return 0


def _cmd_build(args: argparse.Namespace) -> int:
    try:
        build.ensure_built(args.components or None)
    except build.BuildError as exc:
        print(f"[build] FAILED: {exc}", file=sys.stderr)
        return 1
    build.report_disk()
    if args.prune:
        build.prune_go_caches()
    return 0


def _cmd_up(args: argparse.Namespace) -> int:
    run_dir = Path(args.dir) if args.dir else _default_run_dir()
    state = run_dir / "state.json"
    if state.exists() and any(harness.running_from_state(state)):
        print(f"a cluster is already running from {run_dir}; run `down` first", file=sys.stderr)
        return 1
    shutil.rmtree(run_dir, ignore_errors=True)
    cluster = harness.Cluster(run_dir=run_dir, nodes=args.nodes, die_with_parent=False)
    try:
        cluster.start()
    except (harness.ClusterError, build.BuildError) as exc:
        print(f"cluster failed to start: {exc}", file=sys.stderr)
        return 1
    bins = build.bin_dir(build.component("kubernetes"))
    print(f"\nkubeconfig: {cluster.kubeconfig}")
    print(f"server:     {cluster.server}")
    print(f"logs:       {run_dir / 'logs'}")
    print(f"\n  export KUBECONFIG={cluster.kubeconfig}")
    print(f"  export PATH={bins}:$PATH   # kubectl {build.component('kubernetes').version}")
    print("\nstop it with: python -m tests.cluster down")
    return 0


def _state_file(args: argparse.Namespace) -> Path:
    return (Path(args.dir) if args.dir else _default_run_dir()) / "state.json"


def _cmd_down(args: argparse.Namespace) -> int:
    state = _state_file(args)
    if not state.exists():
        print(f"no cluster state at {state}")
        return 0
    stopped = harness.stop_from_state(state)
    state.unlink()
    print(f"stopped: {', '.join(stopped) or 'nothing'}")
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    state = _state_file(args)
    if not state.exists():
        print("not running")
        return 1
    running = {r.name: r.pid for r in harness.running_from_state(state)}
    for name in harness.COMPONENT_ORDER:
        print(f"{name:26s} {'pid ' + str(running[name]) if name in running else 'not running'}")
    return 0 if len(running) == len(harness.COMPONENT_ORDER) else 1


def _cmd_logs(args: argparse.Namespace) -> int:
    run_dir = Path(args.dir) if args.dir else _default_run_dir()
    cluster = harness.Cluster(run_dir=run_dir)
    print(cluster.logs_tail(args.components or None, lines=args.lines))
    return 0


def _cmd_env(args: argparse.Namespace) -> int:
    run_dir = Path(args.dir) if args.dir else _default_run_dir()
    dirs = [build.bin_dir(c) for c in build.components()]
    print(f"export PATH={':'.join(map(str, dirs))}:$PATH")
    print(f"export KUBECONFIG={run_dir / 'kubeconfig'}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Parse arguments and dispatch to a subcommand."""
    parser = argparse.ArgumentParser(
        prog="python -m tests.cluster",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("gomod", help="regenerate toolchain/*/go.mod and go.sum from versions.py")
    p.add_argument("components", nargs="*")
    p.set_defaults(func=_cmd_gomod)

    p = sub.add_parser("build", help="build missing binaries into the cache")
    p.add_argument("components", nargs="*")
    p.add_argument("--prune", action="store_true", help="drop the Go caches afterwards")
    p.set_defaults(func=_cmd_build)

    for name, func, helptext in (
        ("up", _cmd_up, "start a cluster in the background"),
        ("down", _cmd_down, "stop the cluster started by `up`"),
        ("status", _cmd_status, "show which components run"),
        ("logs", _cmd_logs, "print the tail of component logs"),
        ("env", _cmd_env, "print shell exports for PATH and KUBECONFIG"),
    ):
        p = sub.add_parser(name, help=helptext)
        p.add_argument("--dir", help=f"run directory (default {_default_run_dir()})")
        if name == "up":
            p.add_argument("--nodes", type=int, default=3)
        if name == "logs":
            p.add_argument("components", nargs="*")
            p.add_argument("-n", "--lines", type=int, default=40)
        p.set_defaults(func=func)

    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
