"""Build the control-plane binaries from Go modules into a versioned cache.

There is no container runtime and no binary download here, so every
component (kube-apiserver & friends, etcd, kwok, helm) is compiled from the
Go module proxy through a small wrapper module under ``toolchain/``.  Builds
land in ``$MCP_EPOCH_CACHE/bin/<component>-<version>/`` (outside the
repository) and a marker file is written only after a build succeeded, so a
machine that built once starts in seconds and a half-finished build is never
mistaken for a good one.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tests.cluster import versions

TOOLCHAIN_DIR = Path(__file__).resolve().parent / "toolchain"
MARKER = ".build-complete.json"


class BuildError(RuntimeError):
    """A component could not be built; the message carries command and output."""


@dataclass(frozen=True)
class Component:
    """One wrapper module and the binaries built from it."""

    name: str
    version: str
    #: binary name -> Go package path
    binaries: dict[str, str]
    tags: str = ""
    ldflags: tuple[str, ...] = ()
    #: module path -> version; written as ``require`` lines of the wrapper.
    requires: dict[str, str] = field(default_factory=dict)
    #: module path -> version; written as ``replace`` lines of the wrapper.
    replaces: dict[str, str] = field(default_factory=dict)

    @property
    def module_dir(self) -> Path:
        """Folder of the wrapper ``go.mod`` in the repository."""
        return TOOLCHAIN_DIR / self.name

    @property
    def key(self) -> str:
        """Cache key: a new version never reuses an old build."""
        return f"{self.name}-{self.version}"


def cache_root() -> Path:
    """Root of everything this project caches outside the repository."""
    env = os.environ.get("MCP_EPOCH_CACHE")
    base = Path(env) if env else Path.home() / ".cache" / "mcp-epoch"
    return base.expanduser().resolve()


def bin_dir(component: Component) -> Path:
    """Where a component's binaries live once built."""
    return cache_root() / "bin" / component.key


# --------------------------------------------------------------------------- components

# Staging modules that k8s.io/kubernetes requires at v0.0.0 (and replaces with
# ./staging paths that do not exist in the module zip).  Each gets the
# matching v0.X.Y release.
KUBERNETES_STAGING = (
    "api",
    "apiextensions-apiserver",
    "apimachinery",
    "apiserver",
    "cli-runtime",
    "client-go",
    "cloud-provider",
    "cluster-bootstrap",
    "code-generator",
    "component-base",
    "component-helpers",
    "controller-manager",
    "cri-api",
    "cri-client",
    "cri-streaming",
    "csi-translation-lib",
    "dynamic-resource-allocation",
    "endpointslice",
    "externaljwt",
    "kms",
    "kube-aggregator",
    "kube-controller-manager",
    "kube-proxy",
    "kube-scheduler",
    "kubectl",
    "kubelet",
    "metrics",
    "mount-utils",
    "pod-security-admission",
    "sample-apiserver",
    "streaming",
)


def _kubernetes_ldflags(version: str) -> tuple[str, ...]:
    """Version stamps the upstream release build sets (hack/lib/version.sh).

    Without them ``kube-apiserver --version`` says ``v0.0.0-master`` and
    clients that negotiate on the server version misbehave.
    """
    major, minor, _ = version.lstrip("v").split(".", 2)
    stamps = {
        "gitVersion": version,
        "gitMajor": major,
        "gitMinor": minor,
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "1970-01-01T00:00:00Z",
    }
    flags: list[str] = []
    for pkg in ("k8s.io/client-go/pkg/version", "k8s.io/component-base/version"):
        flags += [f"-X {pkg}.{key}={value}" for key, value in stamps.items()]
    return tuple(flags)


def _helm_ldflags(version: str, kubernetes: str) -> tuple[str, ...]:
    """Helm's Makefile stamps its own version and the Kubernetes version it
    renders ``.Capabilities.KubeVersion`` with by default."""
    _, k_minor, _ = kubernetes.lstrip("v").split(".", 2)
    return (
        f"-X helm.sh/helm/v3/internal/version.version={version}",
        "-X helm.sh/helm/v3/internal/version.gitTreeState=clean",
        "-X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=1",
        f"-X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor={k_minor}",
        "-X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1",
        f"-X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor={k_minor}",
    )


def components() -> list[Component]:
    """Every component, in the order they are built (smallest first, so the
    quick ones are usable early)."""
    k8s = versions.KUBERNETES
    staging = versions.staging_version(k8s)
    return [
        Component(
            name="etcd",
            version=versions.ETCD,
            binaries={"etcd": "go.etcd.io/etcd/server/v3"},
            requires={"go.etcd.io/etcd/server/v3": versions.ETCD},
        ),
        Component(
            name="kwok",
            version=versions.KWOK,
            binaries={"kwok": "sigs.k8s.io/kwok/cmd/kwok"},
            ldflags=(f"-X sigs.k8s.io/kwok/pkg/consts.Version={versions.KWOK.lstrip('v')}",),
            requires={"sigs.k8s.io/kwok": versions.KWOK},
        ),
        Component(
            name="helm",
            version=versions.HELM,
            binaries={"helm": "helm.sh/helm/v3/cmd/helm"},
            ldflags=_helm_ldflags(versions.HELM, k8s),
            requires={"helm.sh/helm/v3": versions.HELM},
        ),
        Component(
            name="actionlint",
            version=versions.ACTIONLINT,
            binaries={"actionlint": "github.com/rhysd/actionlint/cmd/actionlint"},
            ldflags=(f"-X github.com/rhysd/actionlint.version={versions.ACTIONLINT}",),
            requires={"github.com/rhysd/actionlint": versions.ACTIONLINT},
        ),
        Component(
            name="kubernetes",
            version=k8s,
            binaries={
                name: f"k8s.io/kubernetes/cmd/{name}"
                for name in (
                    "kube-apiserver",
                    "kube-controller-manager",
                    "kube-scheduler",
                    "kubectl",
                )
            },
            tags=versions.KUBERNETES_BUILD_TAGS,
            ldflags=_kubernetes_ldflags(k8s),
            requires={"k8s.io/kubernetes": k8s},
            replaces={f"k8s.io/{name}": staging for name in KUBERNETES_STAGING},
        ),
    ]


def component(name: str) -> Component:
    """Look a component up by name."""
    for comp in components():
        if comp.name == name:
            return comp
    raise KeyError(name)


def binary_path(binary: str) -> Path:
    """Path of one built binary (whether or not it exists yet)."""
    for comp in components():
        if binary in comp.binaries:
            return bin_dir(comp) / binary
    raise KeyError(binary)


# --------------------------------------------------------------------------- go plumbing


def go_env() -> dict[str, str]:
    """Environment for ``go``: local toolchain only, caches kept with ours.

    The module and build caches live under the project cache unless the
    caller already chose others, so their disk use can be measured and
    pruned without touching anything else on the machine.
    """
    env = dict(os.environ)
    root = cache_root()
    env.setdefault("GOMODCACHE", str(root / "go" / "mod"))
    env.setdefault("GOCACHE", str(root / "go" / "build"))
    env["GOTOOLCHAIN"] = "local"
    env["CGO_ENABLED"] = "0"
    env.setdefault("GOPROXY", "https://proxy.golang.org,direct")
    return env


def _run(cmd: Sequence[str], cwd: Path, log: Path | None = None) -> None:
    """Run a command, raising BuildError with its output tail on failure."""
    out = open(log, "w", encoding="utf-8") if log else subprocess.PIPE  # noqa: SIM115
    try:
        proc = subprocess.run(
            list(cmd), cwd=cwd, env=go_env(), stdout=out, stderr=subprocess.STDOUT, text=True
        )
    finally:
        if log:
            out.close()  # type: ignore[union-attr]
    if proc.returncode != 0:
        text = log.read_text(encoding="utf-8", errors="replace") if log else proc.stdout
        tail = "\n".join((text or "").splitlines()[-40:])
        raise BuildError(
            f"command failed (exit {proc.returncode}) in {cwd}:\n  {shlex.join(cmd)}\n{tail}"
        )


def render_gomod(comp: Component) -> str:
    """The wrapper ``go.mod`` for a component (before ``go mod tidy``)."""
    module = f"mcp-epoch.local/toolchain/{comp.name}"
    lines = [
        "// Generated by `python -m tests.cluster gomod` from tests/cluster/versions.py.",
        "// Edit the versions there, not here.",
        f"module {module}",
        "",
        "go 1.26.0",
        "",
        "require (",
        *(f"\t{path} {ver}" for path, ver in comp.requires.items()),
        ")",
    ]
    if comp.replaces:
        lines += ["", "replace (", *(f"\t{p} => {p} {v}" for p, v in comp.replaces.items()), ")"]
    lines += ["", "tool (", *(f"\t{pkg}" for pkg in comp.binaries.values()), ")", ""]
    return "\n".join(lines)


def regenerate_gomod(comp: Component, log: Callable[[str], None] = print) -> None:
    """Rewrite a wrapper module from the pins and resolve its go.sum."""
    comp.module_dir.mkdir(parents=True, exist_ok=True)
    (comp.module_dir / "go.mod").write_text(render_gomod(comp), encoding="utf-8")
    (comp.module_dir / "go.sum").touch()
    log(f"[gomod] {comp.name}: go mod tidy")
    _run(["go", "mod", "tidy"], comp.module_dir)
    _check_gomod_pins(comp)


def _check_gomod_pins(comp: Component) -> None:
    """Fail if the committed go.mod no longer matches versions.py."""
    gomod = comp.module_dir / "go.mod"
    if not gomod.exists():
        raise BuildError(f"{gomod} is missing; run `python -m tests.cluster gomod`")
    text = gomod.read_text(encoding="utf-8")
    for path, ver in comp.requires.items():
        if f"{path} {ver}" not in text:
            raise BuildError(
                f"{gomod} does not pin {path} {ver} (versions.py changed?); "
                "run `python -m tests.cluster gomod`"
            )


# --------------------------------------------------------------------------- build


def is_built(comp: Component) -> bool:
    """True when the marker and every binary of the component exist."""
    target = bin_dir(comp)
    return (target / MARKER).is_file() and all((target / name).is_file() for name in comp.binaries)


def build_component(comp: Component, log: Callable[[str], None] = print) -> float:
    """Build one component into its cache folder; returns seconds spent.

    The binaries are built into a scratch folder and moved in place before
    the marker is written, so an interrupted build leaves nothing that looks
    usable.
    """
    _check_gomod_pins(comp)
    target = bin_dir(comp)
    scratch = target.with_name(target.name + ".partial")
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    logs = cache_root() / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    cmd = [
        "go",
        "build",
        "-trimpath",
        "-buildvcs=false",
        "-p",
        str(max(1, min(os.cpu_count() or 2, 4))),
        "-ldflags",
        " ".join(("-s", "-w", *comp.ldflags)),
    ]
    if comp.tags:
        cmd += ["-tags", comp.tags]
    if len(comp.binaries) == 1:
        # One package: name the output explicitly (etcd's package path ends in "server/v3").
        ((name, pkg),) = comp.binaries.items()
        cmd += ["-o", str(scratch / name), pkg]
    else:
        cmd += ["-o", str(scratch) + os.sep, *comp.binaries.values()]
    started = time.monotonic()
    log(f"[build] {comp.key}: {' '.join(comp.binaries)} (log: {logs / (comp.key + '.log')})")
    _run(cmd, comp.module_dir, log=logs / f"{comp.key}.log")
    shutil.rmtree(target, ignore_errors=True)
    scratch.rename(target)
    elapsed = time.monotonic() - started
    marker = {
        "component": comp.name,
        "version": comp.version,
        "seconds": round(elapsed, 1),
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "go": subprocess.run(["go", "version"], capture_output=True, text=True).stdout.strip(),
    }
    (target / MARKER).write_text(json.dumps(marker, indent=2) + "\n", encoding="utf-8")
    log(f"[build] {comp.key}: done in {elapsed:.0f}s")
    return elapsed


def ensure_built(
    names: Sequence[str] | None = None, log: Callable[[str], None] = print
) -> dict[str, Path]:
    """Build whatever is missing (sequentially, to spare 2 cores and memory).

    Returns binary name -> path for the requested components.  A failing
    component does not stop the others from being built; afterwards one
    BuildError names every component that failed, with its command and error.
    """
    wanted = [c for c in components() if names is None or c.name in names]
    paths: dict[str, Path] = {}
    failures: list[str] = []
    total = 0.0
    for comp in wanted:
        try:
            if is_built(comp):
                log(f"[build] {comp.key}: cached in {bin_dir(comp)}")
            else:
                total += build_component(comp, log)
            _ensure_extras(comp, log)
        except BuildError as exc:
            log(f"[build] {comp.key}: FAILED")
            failures.append(f"{comp.key}: {exc}")
            continue
        paths.update({name: bin_dir(comp) / name for name in comp.binaries})
    if total:
        log(f"[build] total build time {total:.0f}s")
    if failures:
        raise BuildError("\n".join(failures))
    return paths


# kwok's own default stages (what ``kwokctl`` embeds): nodes become Ready and
# keep their lease, pods become Running/Ready, completed pods finish and
# deleted pods are removed once their finalizers are gone.
KWOK_STAGES = (
    "kustomize/stage/node/fast/node-initialize.yaml",
    "kustomize/stage/node/heartbeat-with-lease/node-heartbeat-with-lease.yaml",
    "kustomize/stage/pod/fast/pod-ready.yaml",
    "kustomize/stage/pod/fast/pod-complete.yaml",
    "kustomize/stage/pod/fast/pod-delete.yaml",
)
KWOK_STAGES_FILE = "stages.yaml"


def kwok_stages_path() -> Path:
    """The kwok ``--config`` file holding the stages of the pinned kwok."""
    return bin_dir(component("kwok")) / KWOK_STAGES_FILE


def _ensure_extras(comp: Component, log: Callable[[str], None]) -> None:
    """Files a component needs beside its binaries.

    The standalone ``kwok`` binary has no default stages, so they are taken
    from the very kwok module version that was built (via ``go mod
    download``) and concatenated into one ``--config`` file.
    """
    if comp.name != "kwok" or kwok_stages_path().is_file():
        return
    proc = subprocess.run(
        ["go", "mod", "download", "-json", f"sigs.k8s.io/kwok@{comp.version}"],
        cwd=comp.module_dir,
        env=go_env(),
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise BuildError(f"go mod download sigs.k8s.io/kwok failed:\n{proc.stdout}{proc.stderr}")
    source = Path(json.loads(proc.stdout)["Dir"])
    docs = [(source / rel).read_text(encoding="utf-8").strip() + "\n" for rel in KWOK_STAGES]
    tmp = kwok_stages_path().with_suffix(".tmp")
    tmp.write_text("---\n".join(docs), encoding="utf-8")
    tmp.rename(kwok_stages_path())
    log(f"[build] {comp.key}: wrote {kwok_stages_path()}")


def disk_usage(path: Path) -> int:
    """Bytes used under a folder (0 if missing)."""
    if not path.exists():
        return 0
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += (Path(dirpath) / name).lstat().st_size
    return total


def report_disk(log: Callable[[str], None] = print) -> None:
    """Print the disk use of binaries and Go caches."""
    env = go_env()
    for label, path in (
        ("binaries", cache_root() / "bin"),
        ("go module cache", Path(env["GOMODCACHE"])),
        ("go build cache", Path(env["GOCACHE"])),
    ):
        log(f"[disk] {label:16s} {disk_usage(path) / 2**20:8.0f} MiB  {path}")


def prune_go_caches(log: Callable[[str], None] = print) -> None:
    """Drop the Go caches after a build: the binaries are all tests need."""
    env = go_env()
    subprocess.run(["go", "clean", "-cache", "-modcache"], env=env, check=False)
    log("[build] pruned go build and module caches")


if __name__ == "__main__":  # pragma: no cover - convenience
    sys.exit(0 if ensure_built() else 1)
