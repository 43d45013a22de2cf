"""The official TypeScript and Go SDK clients, installed from the npm registry and the Go module
proxy at the versions pinned here (``ts/package-lock.json``, ``go/go.mod`` and ``go.sum``),
and cached under ``~/.cache/mcp-epoch/clients`` by the hash of what pins them: the first run
installs (about half a minute), later runs reuse it."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

HERE = Path(__file__).resolve().parent
CACHE = Path.home() / ".cache" / "mcp-epoch"


def _digest(*files: Path) -> str:
    h = hashlib.sha256()
    for f in files:
        h.update(f.read_bytes())
    return h.hexdigest()[:12]


def _run(cmd: list[str], cwd: Path, env: dict[str, str] | None = None) -> None:
    done = subprocess.run(
        cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"{' '.join(cmd)} failed in {cwd} ({done.returncode}); is the package registry "
            f"reachable?\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
        )


def ts_probe() -> list[str]:
    """``node probe.mjs``, with the pinned ``@modelcontextprotocol/sdk`` installed beside it."""
    src = HERE / "ts"
    lock = src / "package-lock.json"
    home = CACHE / "clients" / f"ts-{_digest(src / 'package.json', lock)}"
    if not (home / "node_modules" / "@modelcontextprotocol" / "sdk").is_dir():
        home.mkdir(parents=True, exist_ok=True)
        for name in ("package.json", "package-lock.json"):
            shutil.copy(src / name, home / name)
        npm_cache = str(CACHE / "npm-cache")
        _run(["npm", "ci", "--no-audit", "--no-fund", "--cache", npm_cache], home)
    shutil.copy(src / "probe.mjs", home / "probe.mjs")
    return ["node", str(home / "probe.mjs")]


def go_binary(src: Path, name: str) -> list[str]:
    """The Go module in ``src`` built against its pinned modules, cached as ``name`` by the
    hash of what pins it."""
    binary = (
        CACHE / "clients" / f"{name}-{_digest(*(src / f for f in ('go.mod', 'go.sum', 'main.go')))}"
    )
    if not binary.is_file():
        binary.parent.mkdir(parents=True, exist_ok=True)
        env = {
            **os.environ,
            "GOMODCACHE": str(CACHE / "go" / "mod"),
            "GOCACHE": str(CACHE / "go" / "build"),
            "GOFLAGS": "-mod=readonly",
        }
        _run(["go", "build", "-o", str(binary), "."], src, env)
    return [str(binary)]


def go_probe() -> list[str]:
    """The probe built against the pinned ``github.com/modelcontextprotocol/go-sdk``."""
    return go_binary(HERE / "go", "go-probe")


def probe_calls(language: str, url: str, steps: int) -> list[str]:
    """The ``ts`` or ``go`` probe making calls of ``steps`` progress steps on ``url`` until its
    stdin closes (each probe takes its arguments in its own way)."""
    if language == "go":
        return [*go_probe(), "-url", url, "-steps", str(steps)]
    return [*ts_probe(), url, str(steps)]
