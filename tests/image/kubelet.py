"""What a kubelet does with a pod, done with podman: volumes on disk, then ``podman run``.

:func:`run_args` turns a container of a pod spec, as the API server holds it (or as the chart
renders it), into the ``podman run`` flags that give the container what a kubelet would: user
and groups (``fsGroup`` as a supplementary group), a read-only root filesystem with no tmpfs
of podman's own, the capabilities, ``no-new-privileges``, the seccomp default, the memory limit
(cgroup v1 enforces it here), the environment, ``command``/``args`` against the image's
entrypoint, and each volume mount. :func:`prepare_volumes` lays the pod's volumes out the way
the kubelet does, with its ownership rules: ``emptyDir`` world-writable, Secret, ConfigMap and
projected files (the service account token requested from the API server for this pod)
group-owned by ``fsGroup`` with the spec's modes, and a claim's directory handed to
``fsGroup`` when its root does not match (``OnRootMismatch``).

Not emulated: probes and restarts (kwok owns pod status), image pulls (the image is loaded
from ``make image``'s archive), and cluster DNS (Service names are written to ``/etc/hosts``
with their ClusterIP; :mod:`tests.image.netns` routes ClusterIPs to endpoints).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.e2e.podrunner import PodEnvError, expand, field_value

Pod = dict[str, Any]


@dataclass
class VolumeSources:
    """Where volume contents come from: the API server in a cluster, nothing in the smoke test.

    Each returns ``None`` when the object is absent (the kubelet then keeps the pod waiting)."""

    secret: Callable[[str], dict[str, bytes] | None] = lambda _name: None
    config_map: Callable[[str], dict[str, bytes] | None] = lambda _name: None
    #: (service account, audience or None, expiration seconds) -> a token bound to the pod.
    token: Callable[[str, str | None, int], str] | None = None
    #: claim name -> the persistent directory standing for its volume.
    claim: Callable[[str], Path] | None = None


def _fs_group(pod_spec: Mapping[str, Any]) -> int | None:
    value = (pod_spec.get("securityContext") or {}).get("fsGroup")
    return int(value) if value is not None else None


def _write_files(target: Path, files: Mapping[str, bytes], mode: int, fs_group: int | None) -> None:
    for rel, data in files.items():
        path = target / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        # With fsGroup the kubelet makes volume files group-readable by it.
        path.chmod(mode | (0o040 if fs_group is not None else 0))
        os.chown(path, 0, fs_group if fs_group is not None else 0)


def _items(data: Mapping[str, bytes], items: list[dict[str, Any]] | None) -> dict[str, bytes]:
    if not items:
        return dict(data)
    return {str(i["path"]): data[str(i["key"])] for i in items if str(i["key"]) in data}


def _projected(pod: Pod, source: Mapping[str, Any], sources: VolumeSources) -> dict[str, bytes]:
    spec = pod["spec"]
    if "serviceAccountToken" in source:
        sat = source["serviceAccountToken"]
        if sources.token is None:
            raise PodEnvError("a projected service account token needs the API server")
        token = sources.token(
            str(spec.get("serviceAccountName") or "default"),
            sat.get("audience"),
            int(sat.get("expirationSeconds") or 3600),
        )
        return {str(sat["path"]): token.encode()}
    for kind, fetch in (("secret", sources.secret), ("configMap", sources.config_map)):
        if kind in source:
            ref = source[kind]
            data = fetch(str(ref["name"]))
            if data is None:
                if ref.get("optional"):
                    return {}
                raise PodEnvError(f"projected {kind} {ref['name']!r} not found")
            return _items(data, ref.get("items"))
    if "downwardAPI" in source:
        return {
            str(i["path"]): field_value(pod, str(i["fieldRef"]["fieldPath"])).encode()
            for i in source["downwardAPI"].get("items") or []
        }
    raise PodEnvError(f"unsupported projected source {sorted(source)}")


def prepare_volumes(pod: Pod, root: Path, sources: VolumeSources) -> dict[str, Path]:
    """Lay out every volume of ``pod`` under ``root``; returns volume name -> host path."""
    spec = pod["spec"]
    fs_group = _fs_group(spec)
    paths: dict[str, Path] = {}
    for volume in spec.get("volumes") or []:
        name = str(volume["name"])
        target = root / name
        if "persistentVolumeClaim" in volume:
            if sources.claim is None:
                raise PodEnvError(f"volume {name}: no claim storage here")
            target = sources.claim(str(volume["persistentVolumeClaim"]["claimName"]))
            target.mkdir(parents=True, exist_ok=True)
            if fs_group is not None and target.stat().st_gid != fs_group:
                os.chown(target, 0, fs_group)
                target.chmod(0o2775)
            paths[name] = target
            continue
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir(parents=True)
        if "emptyDir" in volume:
            target.chmod(0o777)
        elif "secret" in volume or "configMap" in volume:
            field, kind, key, fetch = (
                ("secret", "Secret", "secretName", sources.secret)
                if "secret" in volume
                else ("configMap", "ConfigMap", "name", sources.config_map)
            )
            ref = volume[field]
            data = fetch(str(ref[key]))
            if data is None:
                raise PodEnvError(f"volume {name}: {kind} {ref[key]!r} not found")
            mode = int(ref.get("defaultMode", 0o644))
            _write_files(target, _items(data, ref.get("items")), mode, fs_group)
        elif "projected" in volume:
            files: dict[str, bytes] = {}
            for source in volume["projected"].get("sources") or []:
                files.update(_projected(pod, source, sources))
            # The kubelet writes projected tokens 0600, group-readable with fsGroup.
            mode = int(volume["projected"].get("defaultMode", 0o600))
            _write_files(target, files, mode, fs_group)
        else:
            raise PodEnvError(f"volume {name}: unsupported kind {sorted(volume)}")
        target.chmod(target.stat().st_mode | 0o755)
        paths[name] = target
    return paths


def decoded(
    data: Mapping[str, str] | None, binary: Mapping[str, str] | None = None
) -> dict[str, bytes]:
    """A Secret's base64 ``data`` (or a ConfigMap's ``data`` + ``binaryData``) as bytes."""
    out = {k: v.encode() for k, v in (data or {}).items()}
    out.update({k: base64.b64decode(v) for k, v in (binary or {}).items()})
    return out


def _security(pod_spec: Mapping[str, Any], container: Mapping[str, Any]) -> list[str]:
    pod_sc = pod_spec.get("securityContext") or {}
    sc = container.get("securityContext") or {}

    def pick(key: str) -> Any:
        return sc.get(key, pod_sc.get(key))

    args: list[str] = []
    user, group = pick("runAsUser"), pick("runAsGroup")
    if pick("runAsNonRoot") and (user is None or int(user) == 0):
        # The kubelet refuses to start it (CreateContainerConfigError); so does this.
        raise PodEnvError("runAsNonRoot is set but the container would run as UID 0 or unknown")
    if user is not None:
        args += ["--user", f"{int(user)}:{int(group)}" if group is not None else str(int(user))]
    for extra in [*(pod_sc.get("supplementalGroups") or []), _fs_group(pod_spec)]:
        if extra is not None:
            args += ["--group-add", str(int(extra))]
    if sc.get("readOnlyRootFilesystem"):
        args += ["--read-only", "--read-only-tmpfs=false"]
    caps = sc.get("capabilities") or {}
    args += [f"--cap-drop={c}" for c in caps.get("drop") or []]
    args += [f"--cap-add={c}" for c in caps.get("add") or []]
    if sc.get("allowPrivilegeEscalation") is False:
        args += ["--security-opt", "no-new-privileges"]
    seccomp = (pick("seccompProfile") or {}).get("type", "RuntimeDefault")
    if seccomp == "Unconfined":
        args += ["--security-opt", "seccomp=unconfined"]
    elif seccomp != "RuntimeDefault":
        raise PodEnvError(f"unsupported seccompProfile {seccomp!r}")
    if sc.get("privileged"):
        raise PodEnvError("privileged containers are not run here")
    return args


def _memory(quantity: str) -> str:
    units = {"Ki": "k", "Mi": "m", "Gi": "g"}
    for suffix, short in units.items():
        if quantity.endswith(suffix):
            return quantity[: -len(suffix)] + short
    return quantity


def run_args(
    *,
    name: str,
    image: str,
    pod_spec: Mapping[str, Any],
    container: Mapping[str, Any],
    env: Mapping[str, str],
    volumes: Mapping[str, str],
    netns: str,
    hosts: Mapping[str, str] | None = None,
) -> list[str]:
    """``podman run`` arguments for one container; ``volumes`` maps volume names to paths as
    podman (in the tool root) sees them."""
    args = ["run", "--rm", "--name", name, "--network", f"ns:{netns}", "--pull=never"]
    args += ["--hostname", name[:63], "--stop-signal", "SIGTERM"]
    args += _security(pod_spec, container)
    limits = (container.get("resources") or {}).get("limits") or {}
    if "memory" in limits:
        args += ["--memory", _memory(str(limits["memory"]))]
    for key, value in env.items():
        args += ["--env", f"{key}={value}"]
    for host, address in sorted((hosts or {}).items()):
        args += ["--add-host", f"{host}:{address}"]
    for mount in container.get("volumeMounts") or []:
        source = volumes[str(mount["name"])]
        if mount.get("subPath"):
            source = f"{source}/{mount['subPath']}"
        flag = f"{source}:{mount['mountPath']}"
        args += ["--volume", flag + (":ro" if mount.get("readOnly") else "")]
    if container.get("workingDir"):
        args += ["--workdir", str(container["workingDir"])]
    command = [expand(str(c), env) for c in container.get("command") or []]
    if command:
        args += ["--entrypoint", json.dumps(command)]
    args.append(image)
    args += [expand(str(a), env) for a in container.get("args") or []]
    return args
