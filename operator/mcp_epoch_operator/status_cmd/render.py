"""The status dict of :mod:`.model` as one terminal screen, or as JSON (the same dict)."""

from __future__ import annotations

import json
import textwrap
from collections.abc import Sequence
from typing import Any

#: Text is wrapped to the terminal, but never narrower than this.
MIN_WIDTH = 80
NONE = "-"


def as_json(status: dict[str, Any]) -> str:
    return json.dumps(status, indent=2)


def _cell(value: Any) -> str:
    if value is None or value == "":
        return NONE
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def table(header: Sequence[str], rows: Sequence[Sequence[Any]], indent: str = "") -> list[str]:
    """Columns as wide as their widest cell, two spaces apart (kubectl's layout)."""
    cells = [list(header), *([_cell(v) for v in row] for row in rows)]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    return [
        indent + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
        for r in cells
    ]


def _wrap(text: str, width: int, first: str, rest: str) -> list[str]:
    return textwrap.wrap(
        text, width, initial_indent=first, subsequent_indent=rest, break_on_hyphens=False
    ) or [first.rstrip()]


def _ready(pod: dict[str, Any]) -> str:
    if pod["terminating"]:
        return "terminating"
    if pod["phase"] != "Running":
        return str(pod["phase"]).lower()
    return "yes" if pod["ready"] else "no"


def _pods(status: dict[str, Any]) -> list[str]:
    pods = status["pods"]
    if not pods:
        return ["No pods."]
    rows = [
        (
            p["name"],
            _ready(p),
            p["epoch"],
            p["epochState"] or ("unknown" if p["epoch"] and status["ledger"] else None),
            p["incarnation"],
            p["address"] or p["podIP"],
            p["ringRevision"],
            p["sessionsHandedOff"],
            p["sessionsAdopted"],
        )
        for p in pods
    ]
    header = ("POD", "READY", "EPOCH", "STATE", "INC", "ADDRESS", "RING", "HANDED-OFF", "ADOPTED")
    return table(header, rows)


def _ledger(status: dict[str, Any]) -> str:
    ledger = status["ledger"]
    if ledger is None:
        return "not read (the epoch service did not answer)"
    counts = ", ".join(f"{n} {state}" for state, n in ledger["epochs"].items() if n)
    return f"{ledger['id']}, revision {ledger['revision']}: {counts or 'no epochs'}"


def _ring(status: dict[str, Any]) -> list[str]:
    rs = status["requestState"]
    if rs is None:
        if status["ledger"] is None:
            return ["not read"]
        return ["none yet (no pod of this server has loaded one)"]
    first = (
        f"revision {rs['revision']}, {rs['phase']}: {rs['podsAtRevision']} of {rs['pods']} "
        f"pods at revision"
    )
    lines = [first + (" (STALLED)" if rs.get("stalled") else "")]
    if rs.get("behind"):
        lines.append(f"behind: {', '.join(rs['behind'])}")
    if rs.get("waiting"):
        lines.append(f"waiting for: {rs['waiting']}")
    if rs.get("rotationStartedAt"):
        lines.append(f"rotation started {rs['rotationStartedAt']}")
    elif rs.get("lastRotationStartedAt"):
        lines.append(f"last rotation started {rs['lastRotationStartedAt']}")
    return lines


def _handoffs(status: dict[str, Any]) -> list[str]:
    h = status["handoffs"]
    if h["podsRead"]:
        first = (
            f"{h['sessionsHandedOff']} handed off, {h['sessionsAdopted']} adopted by the "
            f"{_count(h['podsRead'], 'pod')} running now"
        )
    else:
        first = "no pod's /metrics could be read"
    lines = [f"{first}; {_count(h['rulesInLedger'], 'handoff rule')} in the ledger"]
    lines += [f"{r['from']} -> {r['to']}" for r in h["recorded"]]
    unread = [p for p in status["pods"] if p["name"] in h["podsUnread"] and p["metricsError"]]
    lines += [f"{p['name']}: /metrics not read: {p['metricsError']}" for p in unread]
    return lines


def _count(n: int, what: str) -> str:
    return f"{n} {what}" + ("" if n == 1 else "s")


def _service(status: dict[str, Any]) -> str:
    svc = status["epochService"]
    if svc["url"] is None:
        return "not found"
    origin = [f"from {svc['urlFrom']}"] if svc["urlFrom"] else []
    origin.append(f"token from {svc['tokenFrom']}" if svc["tokenFrom"] else "no token")
    state = "reachable" if svc["reachable"] else "UNREACHABLE"
    return f"{svc['url']} {state} ({'; '.join(origin)})"


def as_text(status: dict[str, Any], width: int = 100) -> str:
    """One screen: what it is, its pods, the ledger, the ring, handoffs, conditions, and the
    problems with what to do about each."""
    width = max(width, MIN_WIDTH)
    label = 20
    pad = " " * label
    r = status["replicas"]
    lines = [
        f"{status['kind']} {status['namespace']}/{status['server']}: {r['ready']} of "
        f"{r['desired']} ready, {r['updated']} up to date, {r['current']} in total",
    ]

    def field(name: str, values: Sequence[str]) -> None:
        for i, value in enumerate(values):
            lines.extend(_wrap(value, width, (name.ljust(label) if i == 0 else pad), pad))

    field("Epoch service", [_service(status)])
    field("Ledger", [_ledger(status)])
    field("Request-state ring", _ring(status))
    field("Sessions handed off", _handoffs(status))
    lines += ["", *_pods(status)]
    if status["epochsWithoutPod"]:
        lines += ["", "Epochs in the ledger without a pod:"]
        rows = [
            (e["epoch"], e["state"], e["pod"], e["address"]) for e in status["epochsWithoutPod"]
        ]
        lines += table(("EPOCH", "STATE", "POD (GONE)", "ADDRESS"), rows, "  ")
    lines += ["", "Conditions:"]
    for c in status["conditions"]:
        head = f"  {c['type']} {c['status']} {c['reason']} (since {c['lastTransitionTime']}): "
        lines += _wrap(head + c["message"], width, "", "      ")
    problems = status["problems"]
    lines += ["", f"Problems ({len(problems)}):" if problems else "Problems: none"]
    for p in problems:
        tag = "ERROR  " if p["severity"] == "error" else "WARNING"
        lines += _wrap(f"{p['message']}; {p['action']}", width, f"  {tag} ", " " * 10)
    return "\n".join(lines)
