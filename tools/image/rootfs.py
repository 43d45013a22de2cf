"""Root filesystems made with ``debootstrap``, cached outside the repository.

Two are needed, and both take about a minute to make on a fresh machine:

- the **tool root** (Debian 13): buildah and podman new enough for the Dockerfile's syntax,
  with runc, used through ``chroot`` (:mod:`tools.image.chroot`);
- the **base stand-in**: no registry can be reached here, so the Dockerfile's base image is a
  Debian 12 root filesystem with its Python 3.11 and pip, imported under the base image's tag.
  An image built on it checks the Dockerfile's own steps, not the real base.

Each lands in ``$MCP_EPOCH_CACHE/rootfs/<key>/``; the key hashes everything that goes into
it, so a changed package list never reuses an old root. A root is made in a scratch folder
of its own and renamed into place under a file lock, and the marker is written last, so two
builds into one cache never collide and an interrupted one is never mistaken for a good one.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

MARKER = ".rootfs-complete.json"
MIRROR_ENV = "MCP_EPOCH_DEBIAN_MIRROR"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
#: Paths the chroot runner binds onto (:mod:`tools.image.chroot`); made once, at build time,
#: so that running never writes into the shared cache.
TOOL_MOUNT_POINTS = ("ctx", "out", "pods", "var/lib/containers", "run", "tmp", "var/tmp")
TOOL_MOUNT_FILES = ("host/ca.crt", "host/pip.conf")
#: Engine settings for a machine without systemd and with hybrid cgroups (crun cannot run).
CONTAINERS_CONF = """\
[engine]
cgroup_manager = "cgroupfs"
events_logger = "file"
runtime = "runc"
"""

Log = Callable[[str], None]


class RootfsError(RuntimeError):
    """A root filesystem could not be made; the message says what to do."""


def cache_root() -> Path:
    """Root of everything this project caches outside the repository (shared with the
    control-plane build in ``tests/cluster``)."""
    env = os.environ.get("MCP_EPOCH_CACHE")
    base = Path(env) if env else Path.home() / ".cache" / "mcp-epoch"
    return base.expanduser().resolve()


def _finish_tools(root: Path) -> None:
    for point in TOOL_MOUNT_POINTS:
        (root / point).mkdir(parents=True, exist_ok=True)
    for name in TOOL_MOUNT_FILES:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).touch()
    conf = root / "etc/containers/containers.conf.d"
    conf.mkdir(parents=True, exist_ok=True)
    (conf / "mcp-epoch.conf").write_text(CONTAINERS_CONF, encoding="utf-8")


def _finish_base(root: Path) -> None:
    # The official python image has pip-installable `python`; Debian's marks its Python as
    # externally managed and calls it python3.
    for marker in root.glob("usr/lib/python3*/EXTERNALLY-MANAGED"):
        marker.unlink()
    link = root / "usr/local/bin/python"
    link.parent.mkdir(parents=True, exist_ok=True)
    if not link.is_symlink():
        link.symlink_to("/usr/bin/python3")
    for cache in ("var/cache/apt/archives", "var/lib/apt/lists"):
        for item in (root / cache).glob("*"):
            if item.is_file():
                item.unlink()


@dataclass(frozen=True)
class RootSpec:
    """One cached root filesystem: a Debian suite, the packages on top of ``minbase``, and a
    finishing step (its version is part of the key)."""

    name: str
    suite: str
    packages: tuple[str, ...]
    finish: Callable[[Path], None]
    revision: int = 1

    @property
    def key(self) -> str:
        digest = hashlib.sha256(
            json.dumps([self.suite, sorted(self.packages), self.revision]).encode()
        ).hexdigest()[:12]
        return f"{self.name}-{self.suite}-{digest}"

    @property
    def path(self) -> Path:
        return cache_root() / "rootfs" / self.key


TOOLS = RootSpec("tools", "trixie", ("buildah", "podman", "runc", "ca-certificates"), _finish_tools)
BASE = RootSpec("base", "bookworm", ("python3", "python3-pip", "python3-venv"), _finish_base)


def is_built(spec: RootSpec) -> bool:
    return (spec.path / MARKER).is_file()


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _require_tools() -> None:
    if os.geteuid() != 0:
        raise RootfsError(
            "building the image needs root (debootstrap, chroot and mount namespaces); "
            "run `make image` as root or with sudo"
        )
    if shutil.which("debootstrap") is None:
        raise RootfsError("debootstrap is missing; run `make system-deps` (apt) first")


def ensure(spec: RootSpec, log: Log = print) -> Path:
    """The root's path, made first if it is missing."""
    if is_built(spec):
        return spec.path
    _require_tools()
    with _locked(spec.path.with_name(spec.key + ".lock")):
        if is_built(spec):  # another build made it while this one waited
            return spec.path
        mirror = os.environ.get(MIRROR_ENV, DEFAULT_MIRROR)
        scratch = Path(tempfile.mkdtemp(prefix=spec.key + ".partial-", dir=spec.path.parent))
        logfile = scratch.with_suffix(".log")
        log(
            f"[rootfs] {spec.key}: debootstrap {spec.suite} + {', '.join(spec.packages)} "
            f"(about a minute; log: {logfile})"
        )
        started = time.monotonic()
        try:
            with logfile.open("w") as out:
                done = subprocess.run(
                    [
                        "debootstrap",
                        "--variant=minbase",
                        f"--include={','.join(spec.packages)}",
                        spec.suite,
                        str(scratch),
                        mirror,
                    ],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    check=False,
                )
            if done.returncode != 0:
                tail = logfile.read_text(errors="replace").splitlines()[-15:]
                raise RootfsError(
                    f"debootstrap {spec.suite} failed (exit {done.returncode}); is {mirror} "
                    f"reachable? set {MIRROR_ENV} to a Debian mirror. Last lines:\n"
                    + "\n".join(tail)
                )
            spec.finish(scratch)
            shutil.rmtree(spec.path, ignore_errors=True)
            scratch.rename(spec.path)
        except BaseException:
            shutil.rmtree(scratch, ignore_errors=True)
            raise
        finally:
            logfile.unlink(missing_ok=True)
        elapsed = time.monotonic() - started
        marker = {"suite": spec.suite, "packages": list(spec.packages), "seconds": round(elapsed)}
        (spec.path / MARKER).write_text(json.dumps(marker) + "\n", encoding="utf-8")
        log(f"[rootfs] {spec.key}: done in {elapsed:.0f}s")
    return spec.path
