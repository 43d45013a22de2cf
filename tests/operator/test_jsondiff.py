"""The webhook's JSON Patch (``mcp_epoch_operator.jsondiff``): applied by ``jsonpatch``, the
reference implementation of RFC 6902, it turns any document into the other, and it turns a
pod into the pod the webhook wants."""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch
from hypothesis import given
from hypothesis import strategies as st
from mcp_epoch_operator.jsondiff import diff
from mcp_epoch_operator.resources import ReplicaDefaults
from mcp_epoch_operator.webhook import injected, pod_patch

# Keys with the characters JSON Pointer escapes, and values of every JSON type.
keys = st.sampled_from(["a", "b", "x/y", "t~1", "~", "/", "mcp.epochs.dev/epoch", ""])
scalars = st.none() | st.booleans() | st.integers(-3, 3) | st.floats(allow_nan=False) | keys
documents = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(keys, inner, max_size=4),
    max_leaves=20,
)


@given(documents, documents)
def test_the_patch_turns_one_document_into_the_other(old: Any, new: Any) -> None:
    ops = diff(old, new, "")
    assert jsonpatch.apply_patch(copy.deepcopy(old), ops) == new
    if old == new and type(old) is type(new):
        assert ops == []


@given(st.dictionaries(keys, documents, max_size=4), st.dictionaries(keys, documents, max_size=4))
def test_objects_change_key_by_key(old: dict[str, Any], new: dict[str, Any]) -> None:
    ops = diff(old, new)
    assert all(op["path"] for op in ops)  # never the whole document replaced
    assert jsonpatch.apply_patch(copy.deepcopy(old), ops) == new


def test_a_pods_patch_gives_the_injected_pod_and_touches_only_what_changed() -> None:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": "calc-",
            "labels": {"mcp.epochs.dev/server": "calc"},
            "annotations": {"team": "a"},
        },
        "spec": {
            "containers": [
                {"name": "mcp", "image": "registry.invalid/calc:1", "env": [{"name": "A"}]},
                {"name": "other", "image": "registry.invalid/o:1"},
            ],
            "restartPolicy": "Always",
        },
    }
    defaults = ReplicaDefaults("http://epochs:8080", token_audience="mcp-epoch")
    ops = pod_patch(pod, "0123abcd-7", "calc", defaults)
    assert jsonpatch.apply_patch(copy.deepcopy(pod), ops) == injected(
        pod, "0123abcd-7", "calc", defaults
    )
    paths = {op["path"] for op in ops}
    assert "/metadata/annotations/mcp.epochs.dev~1epoch" in paths
    assert not any(p.startswith(("/apiVersion", "/kind", "/metadata/labels")) for p in paths)
