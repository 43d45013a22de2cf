"""A recorded history: every operation a client invoked, when, and what it was told."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True, slots=True)
class Op:
    """One operation. ``output`` None: unknown (a timeout, a broken connection or a 5xx),
    so it may or may not have taken effect. Times are seconds on one monotonic clock."""

    client: int
    server: str
    input: tuple[Any, ...]
    output: tuple[Any, ...] | None
    called: float
    returned: float
    status: int | None = None  # the HTTP status, None when there was no answer
    code: str | None = None  # the error body's code, for the per-fault table
    revision: int | None = None  # the ledger revision a list showed

    def to_json(self) -> dict[str, Any]:
        return {
            "client": self.client,
            "server": self.server,
            "input": list(self.input),
            "output": None if self.output is None else _listed(self.output),
            "called": self.called,
            "returned": self.returned,
            "status": self.status,
            "code": self.code,
            "revision": self.revision,
        }


def _listed(value: Any) -> Any:
    return [_listed(v) for v in value] if isinstance(value, tuple) else value


def _tupled(value: Any) -> Any:
    return tuple(_tupled(v) for v in value) if isinstance(value, list) else value


def save(history: list[Op], path: Path) -> None:
    """One JSON object per line, for a failed history to be looked at (and checked again)."""
    with path.open("w") as f:
        for op in history:
            f.write(json.dumps(op.to_json()) + "\n")


def load(path: Path) -> list[Op]:
    ops = []
    for line in path.read_text().splitlines():
        d = json.loads(line)
        ops.append(
            Op(
                d["client"],
                d["server"],
                _tupled(d["input"]),
                None if d["output"] is None else _tupled(d["output"]),
                d["called"],
                d["returned"],
                d["status"],
                d["code"],
                d["revision"],
            )
        )
    return ops
