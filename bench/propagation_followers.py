"""Followers for the propagation benchmark: ``--views`` replica live views in one process.

    MCP_EPOCH_SERVICE_TOKEN=... python -m bench.propagation_followers URL NAMESPACE SERVER --views N

Each view is the replica library's own :class:`~mcp_epoch._internal.liveview.LiveEpochView`
following the server's epochs by long poll, all on one event loop (a replica runs one view; a
process of many stands in for many replicas). Commands arrive on stdin, one per line:

* ``watch EPOCH``: answers ``live EPOCH`` once every view's copy has that epoch live;
* then, unasked, ``retired EPOCH t1 t2 ...``: the monotonic time (the machine's one clock, so
  comparable across processes) at which each view's copy first had it retired.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time

from mcp_epoch._internal.liveview import LiveEpochView
from mcp_epoch._internal.snapshot import EpochSnapshot


class TimedView(LiveEpochView):
    """A live view that notes when its copy first shows the watched epoch in a state."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.watched: str | None = None
        self.live = asyncio.Event()
        self.retired_at: float | None = None
        self.retired = asyncio.Event()

    def watch(self, epoch: str) -> None:
        self.watched, self.retired_at = epoch, None
        self.live.clear()
        self.retired.clear()
        self._check(self.snapshot)

    def _publish(self, snap: EpochSnapshot) -> None:
        super()._publish(snap)
        self._check(snap)

    def _check(self, snap: EpochSnapshot) -> None:
        record = snap.epochs.get(self.watched or "")
        if record is None:
            return
        if record.state == "live":
            self.live.set()
        elif record.state == "retired" and self.retired_at is None:
            self.retired_at = time.monotonic()
            self.retired.set()


async def _lines() -> asyncio.StreamReader:
    reader = asyncio.StreamReader()
    loop = asyncio.get_running_loop()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    return reader


async def run(url: str, namespace: str, server: str, token: str, views: int) -> None:
    followers = [TimedView(url, namespace, server, token, wait=25.0) for _ in range(views)]
    tasks = [asyncio.create_task(v.follow()) for v in followers]
    reader = await _lines()
    try:
        while line := (await reader.readline()).decode().split():
            if line[0] != "watch":
                continue
            epoch = line[1]
            for v in followers:
                v.watch(epoch)
            await asyncio.gather(*(v.live.wait() for v in followers))
            print(f"live {epoch}", flush=True)
            await asyncio.gather(*(v.retired.wait() for v in followers))
            times = " ".join(f"{v.retired_at:.6f}" for v in followers)
            print(f"retired {epoch} {times}", flush=True)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("url")
    ap.add_argument("namespace")
    ap.add_argument("server")
    ap.add_argument("--views", type=int, required=True)
    args = ap.parse_args()
    token = os.environ["MCP_EPOCH_SERVICE_TOKEN"]  # as a replica reads it; not on the command line
    asyncio.run(run(args.url, args.namespace, args.server, token, args.views))


if __name__ == "__main__":
    main()
