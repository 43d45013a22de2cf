"""The image of ``make image``, loaded into a podman storage of this test run, and containers
of it started and stopped the way a kubelet does (runc, a pod network namespace each).

The storage lives in a scratch folder of the run and the tool root comes from the cache
(:mod:`tools.image.rootfs`), so concurrent runs never share state. A container's lifetime is
its ``podman run`` process: SIGTERM to it is forwarded to the container (podman's signal
proxy), and at the end of the grace period ``podman kill`` sends SIGKILL, as a kubelet would.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tools.image import build, rootfs
from tools.image.chroot import Engine, EngineError, ulimit_args


class ImageMissing(RuntimeError):
    pass


def archive() -> Path:
    path = build.archive_path()
    if not path.is_file():
        raise ImageMissing(f"{path} is missing: run `make image` first (make test does)")
    return path


@dataclass
class Container:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


@dataclass
class ImageRuntime:
    """One loaded image and the containers started from it."""

    engine: Engine
    image: str
    pods: Path  # bound at /pods in the tool root
    containers: dict[str, Container] = field(default_factory=dict)

    @classmethod
    def load(cls, state: Path) -> ImageRuntime:
        source = archive()
        tools = rootfs.ensure(rootfs.TOOLS)
        pods = state / "pods"
        pods.mkdir(parents=True, exist_ok=True)
        engine = Engine(tools, state / "engine", out=source.parent, pods=pods)
        engine.run("podman", "load", "--quiet", "--input", f"/out/{source.name}", timeout=300)
        return cls(engine, build.image_ref(), pods)

    def inside(self, host_path: Path) -> str:
        """How podman (in the tool root) sees a host path under :attr:`pods`."""
        return "/pods/" + str(host_path.resolve().relative_to(self.pods.resolve()))

    def start(self, args: list[str]) -> Container:
        """``podman run args`` (``args`` from :func:`tests.image.kubelet.run_args`)."""
        name = args[args.index("--name") + 1]
        log = self.pods / f"{name}.log"
        with log.open("wb") as out:
            proc = self.engine.popen(
                "podman", "--log-level=error", args[0], *ulimit_args(), *args[1:], stdout=out
            )
        container = Container(name, proc, log)
        self.containers[name] = container
        return container

    def stop(self, name: str, grace: float = 10.0) -> int | None:
        """SIGTERM, then SIGKILL after ``grace`` seconds; returns the exit code."""
        container = self.containers.pop(name, None)
        if container is None or container.proc.poll() is not None:
            return container.proc.returncode if container else None
        container.proc.terminate()
        try:
            return container.proc.wait(grace)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(EngineError):
                self.engine.run("podman", "kill", "--signal", "KILL", name, timeout=30)
            return container.proc.wait(30)

    def close(self) -> None:
        for name in list(self.containers):
            self.stop(name, grace=5)


@contextlib.contextmanager
def image_runtime() -> Iterator[ImageRuntime]:
    if os.geteuid() != 0:
        raise ImageMissing("the image tests need root (chroot, mount and network namespaces)")
    state = Path(tempfile.mkdtemp(prefix="mcp-epoch-image-test-"))
    runtime = ImageRuntime.load(state)
    try:
        yield runtime
    finally:
        runtime.close()
        # Container layers were mounted only inside the calls' own namespaces: nothing to
        # unmount here.
        shutil.rmtree(state, ignore_errors=True)
