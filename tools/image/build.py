"""``make image``: the repository's Dockerfile built daemonlessly into an OCI archive.

The build runs in a fresh image storage of its own (a scratch folder, removed afterwards):
the base stand-in is imported under the Dockerfile's ``FROM`` tag, buildah builds with
``--pull=never`` (no registry is reachable), and the result is saved as
``dist/mcp-epoch-<version>.oci.tar``, written under a temporary name and renamed, so a
reader never sees half an archive.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
import time
import tomllib
from pathlib import Path

from tools.image import rootfs
from tools.image.chroot import Engine, ulimit_args

REPO = Path(__file__).resolve().parents[2]
IMAGE_NAME = "mcp-epoch"


def project_version(repo: Path = REPO) -> str:
    """The release version; ``pyproject.toml`` is its single source."""
    with (repo / "pyproject.toml").open("rb") as handle:
        return str(tomllib.load(handle)["project"]["version"])


def image_ref(version: str | None = None) -> str:
    return f"localhost/{IMAGE_NAME}:{version or project_version()}"


def archive_path(repo: Path = REPO, version: str | None = None) -> Path:
    return repo / "dist" / f"{IMAGE_NAME}-{version or project_version(repo)}.oci.tar"


def base_images(dockerfile: Path) -> set[str]:
    """The external images the Dockerfile's stages start ``FROM`` (stage names excluded)."""
    stages: set[str] = set()
    bases: set[str] = set()
    for line in dockerfile.read_text(encoding="utf-8").splitlines():
        match = re.match(r"\s*FROM\s+(?:--\S+\s+)*(\S+)(?:\s+AS\s+(\S+))?", line, re.IGNORECASE)
        if match:
            if match.group(1) not in stages:
                bases.add(match.group(1))
            if match.group(2):
                stages.add(match.group(2))
    return bases


def qualified(ref: str) -> str:
    """``python:3.11`` as the engines resolve it: ``docker.io/library/python:3.11``."""
    first = ref.split("/", 1)[0]
    if "/" not in ref:
        return f"docker.io/library/{ref}"
    if "." not in first and ":" not in first and first != "localhost":
        return f"docker.io/{ref}"
    return ref


def import_rootfs(engine: Engine, root: Path, ref: str) -> None:
    """Import a root filesystem folder as image ``ref`` (a tar stream into ``podman import``)."""
    tar = subprocess.run(
        ["tar", "-C", str(root), "--exclude", f"./{rootfs.MARKER}", "-c", "."],
        capture_output=True,
        check=True,
    )
    engine.run("podman", "import", "-", qualified(ref), stdin_bytes=tar.stdout)


def build(repo: Path = REPO, log: rootfs.Log = print) -> Path:
    """Build the image and write its OCI archive; returns the archive's path."""
    started = time.monotonic()
    tools = rootfs.ensure(rootfs.TOOLS, log)
    base = rootfs.ensure(rootfs.BASE, log)
    version = project_version(repo)
    target = archive_path(repo, version)
    target.parent.mkdir(parents=True, exist_ok=True)
    state = Path(tempfile.mkdtemp(prefix="mcp-epoch-image-"))
    try:
        engine = Engine(tools, state, context=repo, out=target.parent)
        for ref in sorted(base_images(repo / "Dockerfile")):
            log(f"[image] base {ref}: the Debian 12 stand-in (no registry is reachable here)")
            import_rootfs(engine, base, ref)
        log(f"[image] buildah bud {image_ref(version)} (log follows on failure)")
        engine.run(
            "buildah",
            "bud",
            "--isolation",
            "chroot",
            "--pull=never",
            *ulimit_args(),
            "--volume",
            "/host/ca.crt:/etc/ssl/certs/ca-certificates.crt:ro",
            "--volume",
            "/host/pip.conf:/etc/pip.conf:ro",
            "--build-arg",
            f"VERSION={version}",
            "--tag",
            image_ref(version),
            "/ctx",
        )
        partial = f"/out/.{target.name}.partial"
        engine.run("podman", "save", "--format", "oci-archive", "-o", partial, image_ref(version))
        (target.parent / partial.rsplit("/", 1)[1]).rename(target)
    finally:
        shutil.rmtree(state, ignore_errors=True)
    size = target.stat().st_size / 1e6
    log(f"[image] {target} ({size:.0f} MB) in {time.monotonic() - started:.0f}s")
    return target
