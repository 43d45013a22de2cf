"""The JSON Patch (RFC 6902) from one JSON document to another, for the webhook's answer.

Not ``jsonpatch.JsonPatch.from_diff``: its general diff (it looks for moves and copies) took
~1 ms per pod, on every admission's path, for a change that only ever adds and replaces a few
fields. This walks both documents once: objects key by key, arrays of the same length element
by element, and anything else that differs (including arrays whose length changed) is
replaced whole. The result is correct for any two documents, only sometimes larger than the
smallest patch; the tests apply it with ``jsonpatch`` and compare.
"""

from __future__ import annotations

from typing import Any

Op = dict[str, Any]


def pointer_token(key: str) -> str:
    """One JSON Pointer reference token (RFC 6901: ``~`` and ``/`` escaped)."""
    return key.replace("~", "~0").replace("/", "~1")


def diff(old: Any, new: Any, path: str = "") -> list[Op]:
    """Operations that turn ``old`` into ``new`` (an empty list when they are equal)."""
    ops: list[Op] = []
    _diff(old, new, path, ops)
    return ops


def _diff(old: Any, new: Any, path: str, ops: list[Op]) -> None:
    if type(old) is not type(new):
        ops.append({"op": "replace", "path": path, "value": new})
    elif isinstance(old, dict):
        for key, value in old.items():
            here = f"{path}/{pointer_token(key)}"
            if key not in new:
                ops.append({"op": "remove", "path": here})
            else:
                _diff(value, new[key], here, ops)
        for key, value in new.items():
            if key not in old:
                ops.append({"op": "add", "path": f"{path}/{pointer_token(key)}", "value": value})
    elif isinstance(old, list) and len(old) == len(new):
        for i, (a, b) in enumerate(zip(old, new, strict=True)):
            _diff(a, b, f"{path}/{i}", ops)
    elif old != new:
        ops.append({"op": "replace", "path": path, "value": new})
