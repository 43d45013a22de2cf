"""The client side of a multi-round-trip request (MCP 2026-07-28) for the tests: the real
``mcp.Client`` answering the demo replica's ``approve`` question through its elicitation
callback, and where each round of each call went (from the demo balancer)."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

import mcp.types as types
from mcp import Client

from epochsvc.demo.balancer import Backend


@dataclass
class Rounds:
    """Where each round of each call went, from the balancer: (replica, a retry?)."""

    seen: list[tuple[str, bool]] = field(default_factory=list)

    def record(self, backend: Backend, body: bytes) -> None:
        if b'"tools/call"' in body:
            self.seen.append((backend.name, b'"requestState"' in body))

    def crossings(self) -> tuple[int, int]:
        """(retries, retries that reached another replica than the round before them)."""
        retries = crossed = 0
        for (before, _), (now, retry) in zip(self.seen, self.seen[1:], strict=False):
            if retry:
                retries += 1
                crossed += before != now
        return retries, crossed


@dataclass
class Outcome:
    calls: int = 0
    failures: list[str] = field(default_factory=list)


async def answer(_context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
    return types.ElicitResult(action="accept", content={"token": params.message})


async def call_approve(url: str, until: asyncio.Event | None = None, count: int = 0) -> Outcome:
    """Sequential calls (so the balancer's alternation sends every retry elsewhere), ``count``
    of them or until ``until`` is set."""
    outcome = Outcome()
    async with Client(url, mode="2026-07-28", elicitation_callback=answer) as c:
        while (until is not None and not until.is_set()) or outcome.calls < count:
            subject = f"s{outcome.calls}"
            outcome.calls += 1
            try:
                result = await c.call_tool("approve", {"subject": subject})
            except Exception as exc:  # the retry refused: what the control must show
                outcome.failures.append(f"{subject}: {exc!r}")
                continue
            text = result.content[0].text if result.content else ""  # type: ignore[union-attr]
            if result.is_error or json.loads(text).get("subject") != subject:
                outcome.failures.append(f"{subject}: {text}")
    return outcome
