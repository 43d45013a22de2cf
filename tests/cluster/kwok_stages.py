"""The kwok stages a cluster runs with: kwok's own defaults, and pods whose readiness the pod
runner reports.

kwok makes a pod Ready the moment it is Running: it runs no probes. That is right for pods
nothing runs, but a pod whose container the pod runner (tests/e2e/podrunner.py) really runs
would then be Ready before its process listens, and a rollout would stop an old pod for a
replacement that cannot serve yet. A pod labelled :data:`PROBER_LABEL` ``=``
:data:`PROBER_VALUE` therefore becomes Running with its containers not ready, as a kubelet
starts a container that has a readiness probe, and the pod runner, standing in for the
kubelet's prober, marks it Ready when its probe passes. Every other pod keeps kwok's default
stage.

The file is composed per cluster from the cached defaults (``build.kwok_stages_path()``), so
the cache holds only what kwok itself ships.
"""

from __future__ import annotations

from typing import Any

import yaml

#: A pod label: this pod's readiness is reported by the pod runner, not made up by kwok.
PROBER_LABEL = "readiness.mcp-epoch.test/prober"
PROBER_VALUE = "pod-runner"
_SELECTED = f'.metadata.labels["{PROBER_LABEL}"]'

#: kwok's stage that makes a pending pod Running and Ready (in its "fast" set).
DEFAULT_READY_STAGE = "pod-ready"
PROBED_STAGE = "pod-running-unready"

# What a kubelet reports for a started container with a readiness probe that has not passed
# yet: Running, a pod IP, every container started but not ready.
_UNREADY_STATUS = """\
{{ $now := Now }}
conditions:
- lastTransitionTime: {{ $now | Quote }}
  status: "True"
  type: Initialized
- lastTransitionTime: {{ $now | Quote }}
  status: "False"
  reason: ContainersNotReady
  type: Ready
- lastTransitionTime: {{ $now | Quote }}
  status: "False"
  reason: ContainersNotReady
  type: ContainersReady
containerStatuses:
{{ range .spec.containers }}
- image: {{ .image | Quote }}
  name: {{ .name | Quote }}
  ready: false
  started: true
  restartCount: 0
  state:
    running:
      startedAt: {{ $now | Quote }}
{{ end }}
{{ with NodeIPsWith .spec.nodeName }}
hostIP: {{ index . 0 | Quote }}
hostIPs:
{{ range . }}
- ip: {{ . | Quote }}
{{ end }}
{{ end }}
{{ $host := or .spec.hostNetwork false }}
{{ $uid := or .metadata.uid "" }}
{{ $name := or .metadata.name "" }}
{{ with PodIPsWith .spec.nodeName $host $uid $name ( or .metadata.namespace "" ) }}
podIP: {{ index . 0 | Quote }}
podIPs:
{{ range . }}
- ip: {{ . | Quote }}
{{ end }}
{{ end }}
phase: Running
startTime: {{ $now | Quote }}
"""


def _probed_stage(default: dict[str, Any]) -> dict[str, Any]:
    """kwok's ready stage narrowed to labelled pods, with the not-ready status."""
    spec = default["spec"]
    expressions = list(spec["selector"]["matchExpressions"])
    return {
        "apiVersion": default["apiVersion"],
        "kind": "Stage",
        "metadata": {"name": PROBED_STAGE},
        "spec": {
            "resourceRef": spec["resourceRef"],
            "selector": {
                "matchExpressions": [
                    *expressions,
                    {"key": _SELECTED, "operator": "In", "values": [PROBER_VALUE]},
                ]
            },
            "next": {"statusTemplate": _UNREADY_STATUS},
        },
    }


def compose(defaults: str) -> str:
    """kwok's default stages with their ready stage skipping labelled pods, plus the stage
    that starts those unready. Raises if the defaults have no ready stage (a kwok upgrade
    renamed it: the labelled pods would then be made Ready by kwok, silently)."""
    docs = [d for d in yaml.safe_load_all(defaults) if d]
    ready = [d for d in docs if d.get("metadata", {}).get("name") == DEFAULT_READY_STAGE]
    if len(ready) != 1:
        raise ValueError(f"kwok's default stages have no single {DEFAULT_READY_STAGE!r} stage")
    probed = _probed_stage(ready[0])
    selector = ready[0]["spec"]["selector"]
    selector["matchExpressions"] = [
        *selector["matchExpressions"],
        {"key": _SELECTED, "operator": "NotIn", "values": [PROBER_VALUE]},
    ]
    return yaml.safe_dump_all([*docs, probed], sort_keys=False)
