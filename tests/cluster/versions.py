"""The one place where every control-plane component version is pinned.

The build script, the generated wrapper ``go.mod`` files and the cache
folder names are all derived from these values, so bumping a component is a
one-line change here followed by ``python -m tests.cluster gomod``.
"""

from __future__ import annotations

from typing import Final

#: k8s.io/kubernetes release; its staging modules are pinned to v0.<minor>.<patch>.
KUBERNETES: Final = "v1.37.2"
#: etcd 3.6 (3.7 is avoided on purpose: 3.6 is what current API servers are tested with).
ETCD: Final = "v3.6.16"
#: kwok >= 0.8 keeps finalizers intact when it finishes pod deletions.
KWOK: Final = "v0.8.0"
#: helm v3 for the chart tests.
HELM: Final = "v3.22.0"
#: actionlint checks the GitHub Actions workflows in `make lint`.
ACTIONLINT: Final = "v1.7.12"

#: Go build tags used by the upstream Kubernetes release build.
KUBERNETES_BUILD_TAGS: Final = "selinux,notest,grpcnotrace"


def staging_version(kubernetes: str = KUBERNETES) -> str:
    """Map ``v1.X.Y`` to the staging-module version ``v0.X.Y``."""
    major, minor, patch = kubernetes.lstrip("v").split(".", 2)
    if major != "1":
        raise ValueError(f"unexpected Kubernetes version {kubernetes!r}")
    return f"v0.{minor}.{patch}"
