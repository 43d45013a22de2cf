"""The long-poll benchmark's floor: a bare ASGI app on the same uvicorn, with no framework and no
store, that holds long polls and wakes them as the service does.

    python -m bench.longpoll_floor --port P

Every ``GET /poll`` is held until one ``POST /change``; then all of them are answered with the
same prebuilt body, about the size of a one-epoch list, resumed in batches per loop turn as the
service resumes its own (``WAKE_BATCH``). ``/metrics`` reports how many are held
as the service does (``epochsvc_longpoll_waiters``), so the same load generator drives both.
What it takes to wake N waiters here is what the ASGI server, the event loop and the kernel
take whatever runs above them: the service's wake figures are read against it. It prints one
JSON line once it listens.

It runs on the service's own process and server settings (open-file limit, collector
thresholds, no access log), or it is not the floor:

* on Python's default thresholds it ran, holding 10,000 connections, 20 full collections in
  four rounds, of up to 295 ms each, against the service's two: its wake figures depended on
  where a pause fell, and flattered the service's ratio by as much as they spread;
* with uvicorn's default access log it built each answer's log fields even though its level
  drops the line: a tenth of its time per waiter, under a profiler.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

import uvicorn

from bench.servers import run_announcing
from epochsvc.service.longpoll import WAKE_BATCH
from epochsvc.service.serve import LISTEN_BACKLOG, quiet_collector, raise_open_files_limit

BODY = json.dumps(
    {
        "ledger_id": "0" * 32,
        "revision": 2,
        "epochs": [
            {
                "epoch": "00000000-1",
                "namespace": "bench",
                "server": "lp",
                "state": "pending",
                "request_uid": "00000000-0000-0000-0000-000000000000",
                "pod_name": None,
                "incarnation": None,
                "address": None,
                "revision": 2,
            }
        ],
    }
).encode()


class Floor:
    def __init__(self) -> None:
        self.waiting: list[asyncio.Future[None]] = []
        self.held = 0
        self._waking: asyncio.Future[None] | None = None

    async def wake(self) -> None:
        waiting, self.waiting = self.waiting, []
        for start in range(0, len(waiting), WAKE_BATCH):
            if start:
                await asyncio.sleep(0)
            for future in waiting[start : start + WAKE_BATCH]:
                future.set_result(None)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        status, body = 200, b"ok"
        if scope["path"] == "/poll":
            self.held += 1
            woken = asyncio.get_running_loop().create_future()
            self.waiting.append(woken)
            await woken
            self.held -= 1
            body = BODY
        elif scope["path"] == "/change":
            while (await receive()).get("more_body", False):
                pass
            self._waking = asyncio.ensure_future(self.wake())
            status = 201
        elif scope["path"] == "/metrics":
            body = f"epochsvc_longpoll_waiters {self.held}\n".encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.longpoll_floor")
    ap.add_argument("--port", type=int, required=True)
    args = ap.parse_args(argv)
    raise_open_files_limit()
    quiet_collector()  # the service's thresholds (see above)
    config = uvicorn.Config(
        Floor(),
        host="127.0.0.1",
        port=args.port,
        log_level="warning",
        access_log=False,  # as the service below debug (see above)
        lifespan="off",
        backlog=LISTEN_BACKLOG,
    )
    run_announcing(
        uvicorn.Server(config), lambda: print(json.dumps({"port": args.port}), flush=True)
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
