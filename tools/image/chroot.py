"""buildah and podman from the tool root, each call in a mount namespace of its own.

Every call runs ``unshare --mount`` and, inside that private namespace, bind-mounts the tool
root onto itself (buildah and podman need a mount point as their root), the kernel's
``/proc``, ``/dev`` and ``/sys``, and the folders of one :class:`Engine`: its image storage,
its run and temporary folders, the build context and the output folder. Nothing is mounted
in the machine's own namespace, so nothing is left behind when a call ends or is killed, and
two engines (two builds, two test runs) on one tool root never see each other's storage.

Containers run with runc (crun fails on this machine's hybrid cgroups), cgroupfs and a file
events log (there is no systemd), and ulimits within the hard limits root has here.
"""

from __future__ import annotations

import os
import resource
import shlex
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

#: The CA bundle and pip configuration of this machine, mounted (never copied) into build
#: steps that reach a package registry.
HOST_CA = Path(os.environ.get("SSL_CERT_FILE", "/etc/ssl/certs/ca-certificates.crt"))
HOST_PIP_CONF = Path(os.environ.get("PIP_CONFIG_FILE", "/etc/pip.conf"))

_SETUP = r"""
set -eu
root=$1; shift
mount --rbind "$root" "$root"
mount -t proc proc "$root/proc"
mount --rbind /dev "$root/dev"
mount --rbind /sys "$root/sys"
while [ "$1" != "--" ]; do
  mount --rbind "$1" "$root/$2"; shift 2
done
shift
[ -d /run/netns ] && mkdir -p "$root/run/netns" && mount --rbind /run/netns "$root/run/netns"
exec chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root "$@"
"""


def ulimit_args() -> list[str]:
    """``--ulimit`` flags at this machine's hard limits: root here cannot raise them, and the
    engines' defaults are higher."""
    args = []
    for name, limit in (("nofile", resource.RLIMIT_NOFILE), ("nproc", resource.RLIMIT_NPROC)):
        hard = resource.getrlimit(limit)[1]
        if hard != resource.RLIM_INFINITY:
            args += ["--ulimit", f"{name}={hard}:{hard}"]
    return args


@dataclass
class Engine:
    """One image storage and the folders bound into the tool root for its calls.

    ``state`` holds the storage (``/var/lib/containers``), ``/run`` and the temporary folders;
    ``context``, ``out`` and ``pods`` are bound at ``/ctx``, ``/out`` and ``/pods``.
    """

    tool_root: Path
    state: Path
    context: Path | None = None
    out: Path | None = None
    pods: Path | None = None
    extra_binds: dict[Path, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for sub in ("storage", "run", "tmp"):
            (self.state / sub).mkdir(parents=True, exist_ok=True)
        pip_conf = self.state / "pip.conf"
        if HOST_PIP_CONF.is_file():
            pip_conf.write_text(HOST_PIP_CONF.read_text(encoding="utf-8"), encoding="utf-8")
        else:
            pip_conf.write_text("[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n")

    def binds(self) -> list[tuple[Path, str]]:
        pairs: list[tuple[Path, str]] = [
            (self.state / "storage", "var/lib/containers"),
            (self.state / "run", "run"),
            (self.state / "tmp", "tmp"),
            (self.state / "tmp", "var/tmp"),
            (self.state / "pip.conf", "host/pip.conf"),
        ]
        if HOST_CA.is_file():
            pairs.append((HOST_CA, "host/ca.crt"))
        for path, point in ((self.context, "ctx"), (self.out, "out"), (self.pods, "pods")):
            if path is not None:
                pairs.append((path, point))
        pairs += [(path, point.lstrip("/")) for path, point in self.extra_binds.items()]
        return pairs

    def argv(self, tool: str, args: Sequence[str]) -> list[str]:
        """The host command line that runs ``tool args`` in the tool root."""
        bind_args: list[str] = []
        for host, point in self.binds():
            bind_args += [str(host), point]
        return [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            _SETUP,
            "sh",
            str(self.tool_root),
            *bind_args,
            "--",
            tool,
            *args,
        ]

    def run(
        self,
        tool: str,
        *args: str,
        stdin_bytes: bytes | None = None,
        timeout: float = 900,
        check: bool = True,
    ) -> subprocess.CompletedProcess[str]:
        """Run to completion; a failure raises :class:`EngineError` with the tool's output."""
        raw = subprocess.run(
            self.argv(tool, args),
            input=stdin_bytes,
            capture_output=True,
            timeout=timeout,
            check=False,
        )
        done = subprocess.CompletedProcess(
            raw.args,
            raw.returncode,
            raw.stdout.decode(errors="replace"),
            raw.stderr.decode(errors="replace"),
        )
        if check and done.returncode != 0:
            raise EngineError(tool, args, done)
        return done

    def popen(
        self, tool: str, *args: str, stdout: IO[bytes] | None = None
    ) -> subprocess.Popen[bytes]:
        """Start in the background (a container's lifetime is this process's: ``podman run``
        forwards SIGTERM to the container)."""
        return subprocess.Popen(
            self.argv(tool, args),
            stdout=stdout,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


class EngineError(RuntimeError):
    """buildah or podman failed; carries its command and output."""

    def __init__(
        self, tool: str, args: Sequence[str], done: subprocess.CompletedProcess[str]
    ) -> None:
        self.stdout, self.stderr = done.stdout, done.stderr
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-25:])
        super().__init__(f"{tool} {shlex.join(args)} exited {done.returncode}:\n{tail}")
