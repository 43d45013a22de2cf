"""EpochEventStore vs a naive per-process counter store, in one run.

    .venv/bin/python bench/replica_bench.py [--quick]

Prints store_event throughput, replay latency for 100 and 3,000 missed events, and resident
memory after 1,000,000 events with a 3,000-event capacity (each store measured in a fresh
subprocess, so the figures do not contaminate each other), with ratios.

The naive store is modelled on the SDK's example in-memory store: a deque per stream bounded to
the capacity and a dict from event ID to entry, but with IDs from a per-process counter (the
pattern that breaks across processes). Stream IDs rotate like JSON-RPC request IDs do.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import statistics
import subprocess
import sys
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mcp.server.streamable_http import EventMessage, EventStore
from mcp_types import JSONRPCMessage, JSONRPCNotification, JSONRPCResponse

from mcp_epoch._internal.sessions import SessionTag, current_session
from mcp_epoch._internal.store import EpochEventStore
from mcp_epoch.contract import PodEpoch, ProcessEpoch

CAPACITY = 3000
EPOCH = ProcessEpoch(PodEpoch("9f2c1a7e", 42), 0)


@dataclass
class _Entry:
    event_id: str
    stream_id: str
    message: JSONRPCMessage | None


class NaiveCounterStore(EventStore):
    """Per-stream deques + an id index, ids from ``itertools.count`` (process-local)."""

    def __init__(self, max_events_per_stream: int = CAPACITY) -> None:
        self.max = max_events_per_stream
        self.streams: dict[str, deque[_Entry]] = {}
        self.index: dict[str, _Entry] = {}
        self.counter = 0

    async def store_event(self, stream_id: str, message: JSONRPCMessage | None) -> str:
        self.counter += 1
        event_id = str(self.counter)
        entry = _Entry(event_id, stream_id, message)
        q = self.streams.get(stream_id)
        if q is None:
            q = self.streams[stream_id] = deque()
        if len(q) == self.max:
            del self.index[q.popleft().event_id]
        q.append(entry)
        self.index[event_id] = entry
        return event_id

    async def replay_events_after(
        self, last_event_id: str, send_callback: Callable[[EventMessage], Awaitable[None]]
    ) -> str | None:
        last = self.index.get(last_event_id)
        if last is None:
            return None
        found = False
        for entry in self.streams[last.stream_id]:
            if found and entry.message is not None:
                await send_callback(EventMessage(entry.message, entry.event_id))
            elif entry.event_id == last_event_id:
                found = True
        return last.stream_id


def make(kind: str, capacity: int = CAPACITY) -> EventStore:
    if kind == "epoch":
        return EpochEventStore(EPOCH, capacity=capacity)
    return NaiveCounterStore(capacity)


MESSAGE = JSONRPCNotification(
    jsonrpc="2.0", method="notifications/progress", params={"progressToken": "t", "progress": 1}
)


FINAL = JSONRPCResponse(jsonrpc="2.0", id=5, result={})


async def throughput(kind: str, n: int) -> float:
    store = make(kind)
    current_session.set(SessionTag("bench"))
    streams = [str(i) for i in range(16)]
    gc.collect()
    t0 = time.perf_counter()
    for i in range(n):
        await store.store_event(streams[i & 15], MESSAGE)
    return (time.perf_counter() - t0) / n


async def replay_latency(kind: str, missed: int, repeats: int) -> float:
    # Room for the cursor's own event plus everything missed after it.
    store = make(kind, CAPACITY + 1)
    current_session.set(SessionTag("bench"))
    ids = [await store.store_event("5", MESSAGE) for _ in range(CAPACITY)]
    # The request's final response ends its stream: a resumed stream is served until then.
    ids.append(await store.store_event("5", FINAL))
    cursor = ids[-missed - 1]
    sent = 0

    async def sink(_: EventMessage) -> None:
        nonlocal sent
        sent += 1

    times = []
    for _ in range(repeats):
        sent = 0
        t0 = time.perf_counter()
        await store.replay_events_after(cursor, sink)
        times.append(time.perf_counter() - t0)
        assert sent == missed, (kind, sent, missed)
    return statistics.median(times)


def rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


async def memory(kind: str, total: int) -> dict[str, int]:
    store = make(kind)
    current_session.set(SessionTag("bench"))
    out = {"start": rss_kib()}
    for i in range(total):
        # A new stream every 10 events, like one tool call per JSON-RPC request id.
        await store.store_event(str(i // 10), MESSAGE)
        if i + 1 in (total // 10, total):
            gc.collect()
            out[str(i + 1)] = rss_kib()
    return out


def child(kind: str, total: int) -> None:
    print(json.dumps(asyncio.run(memory(kind, total))))


def measure_memory(kind: str, total: int) -> dict[str, int]:
    out = subprocess.run(
        [sys.executable, __file__, "--child", kind, "--events", str(total)],
        check=True,
        capture_output=True,
        text=True,
    )
    return dict(json.loads(out.stdout))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench replica")
    ap.add_argument("--quick", action="store_true", help="smaller run (CI smoke)")
    ap.add_argument("--child")
    ap.add_argument("--events", type=int, default=1_000_000)
    args = ap.parse_args(argv)
    if args.child:
        child(args.child, args.events)
        return 0
    n = 50_000 if args.quick else 300_000
    total = 100_000 if args.quick else args.events
    repeats = 5 if args.quick else 30

    print(f"store_event, {n} events over 16 streams (best of 3)")
    per: dict[str, float] = {}
    for kind in ("naive", "epoch"):
        per[kind] = min(asyncio.run(throughput(kind, n)) for _ in range(3))
        print(f"  {kind:6} {per[kind] * 1e9:8.0f} ns/event  {1 / per[kind]:12,.0f} events/s")
    print(f"  ratio epoch/naive: {per['epoch'] / per['naive']:.2f}x  (target <= 1.5x)")

    for missed in (100, 3000):
        print(f"replay of {missed} missed events (median of {repeats})")
        lat = {k: asyncio.run(replay_latency(k, missed, repeats)) for k in ("naive", "epoch")}
        for kind, value in lat.items():
            print(f"  {kind:6} {value * 1e3:8.3f} ms")
        print(f"  ratio epoch/naive: {lat['epoch'] / lat['naive']:.2f}x")

    print(f"resident memory, {total:,} events, capacity {CAPACITY}, new stream every 10 events")
    for kind in ("naive", "epoch"):
        m = measure_memory(kind, total)
        tenth = m[str(total // 10)]
        end = m[str(total)]
        print(
            f"  {kind:6} start {m['start'] / 1024:7.1f} MiB  after {total // 10:,}: "
            f"{tenth / 1024:7.1f} MiB  after {total:,}: {end / 1024:7.1f} MiB  "
            f"(growth over the last 90%: {(end - tenth) / 1024:+.1f} MiB)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
