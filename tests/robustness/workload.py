"""Concurrent clients that drive the epoch service over HTTP and record what they were told.

Each worker is one client: it runs one operation at a time, on a server picked at random from
a few, and records every operation (:class:`~tests.robustness.history.Op`). A request that
times out, loses its connection or gets a 5xx is recorded as unknown, and an issue whose
answer was lost is retried with the same ``request_uid``, as the operator's webhook does.
Workers spread over every service URL given (two processes on one PostgreSQL, say).
"""

from __future__ import annotations

import asyncio
import itertools
import random
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx

from tests.robustness.history import Op

NAMESPACE = "robust"
#: A request unanswered after this long is unknown (a paused service holds it longer).
REQUEST_TIMEOUT = 3.0


@dataclass
class Workload:
    urls: list[str]
    token: str
    operations: int
    workers: int = 12
    servers: int = 4
    seed: int = 0
    uds: str | None = None  # reach the service through this Unix socket
    history: list[Op] = field(default_factory=list)
    _gens: dict[str, list[int]] = field(default_factory=lambda: defaultdict(list))
    _uids: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    _uid_serial: Iterator[int] = field(default_factory=itertools.count)
    refused: int = 0  # requests no service took (connection refused)
    _count: int = 0
    _stop: bool = False
    _revision: dict[int, int] = field(default_factory=dict)  # the newest each client saw
    _ledger8: str = ""
    #: Set once ``mark`` operations have been run (when a fault is due).
    mark: int = 0
    reached: asyncio.Event = field(default_factory=asyncio.Event)

    def stop(self) -> None:
        self._stop = True

    async def run(self, progress: Callable[[int], None] | None = None) -> list[Op]:
        async with self._client(self.urls[0]) as http:
            self._ledger8 = (await http.get("/readyz")).json()["ledger_id"][:8]
        await asyncio.gather(*(self._worker(i, progress) for i in range(self.workers)))
        await self.final_reads()
        return self.history

    async def final_reads(self) -> None:
        """Once the faults are over: every server listed, through every URL, until answered,
        so an acknowledged epoch that was lost shows as missing."""
        for n, url in enumerate(self.urls):
            async with self._client(url) as http:
                for s in range(self.servers):
                    for _ in range(100):
                        op = await self._call(http, self.workers + n, f"s{s}", ("list",))
                        if op.output is not None:
                            break
                        await asyncio.sleep(0.1)

    def _client(self, url: str) -> httpx.AsyncClient:
        transport = httpx.AsyncHTTPTransport(uds=self.uds) if self.uds else None
        return httpx.AsyncClient(
            transport=transport,
            base_url=url,
            headers={"Authorization": f"Bearer {self.token}"},
            timeout=REQUEST_TIMEOUT,
        )

    async def _worker(self, me: int, progress: Callable[[int], None] | None) -> None:
        rng = random.Random(self.seed * 1000 + me)
        retry: tuple[str, str] | None = None  # an issue to repeat (its answer was lost)
        async with self._client(self.urls[me % len(self.urls)]) as http:
            while not self._stop and self._count < self.operations:
                self._count += 1
                if self._count >= self.mark:
                    self.reached.set()
                if progress is not None and self._count % 1000 == 0:
                    progress(self._count)
                if retry is not None:
                    server, uid = retry
                    inp: tuple[Any, ...] = ("issue", uid)
                else:
                    server = f"s{rng.randrange(self.servers)}"
                    inp = self._pick(rng, me, server)
                op = await self._call(http, me, server, inp)
                retry = (server, inp[1]) if inp[0] == "issue" and op.output is None else None
                if op.output is None:
                    await asyncio.sleep(0.05)  # back off from a service that did not answer

    def _pick(self, rng: random.Random, me: int, server: str) -> tuple[Any, ...]:
        gens = self._gens[server]
        roll = rng.random()
        if not gens or roll < 0.22:
            uid = f"u{me}-{next(self._uid_serial)}"  # never reused, whatever else happens
            self._uids[server].append(uid)
            return ("issue", uid)
        if roll < 0.27:
            return ("issue", rng.choice(self._uids[server]))
        # Mostly the newest epochs, where the transitions still go somewhere.
        gen = gens[-1 - min(int(rng.expovariate(0.3)), len(gens) - 1)]
        if roll < 0.40:
            # Now and then a pod bound elsewhere (kept within the server, which the checker's
            # partitions need).
            pod = f"pod-{gen}" if rng.random() > 0.05 else f"intruder-{server}"
            return ("bind", gen, pod)
        if roll < 0.50:
            return ("drain", gen)
        if roll < 0.58:
            return ("retire", gen)
        if roll < 0.68:
            return ("incarnate", gen)
        if roll < 0.83:
            return ("get", gen)
        if roll < 0.93:
            return ("list",)
        return ("poll",)

    async def _call(
        self, http: httpx.AsyncClient, me: int, server: str, inp: tuple[Any, ...]
    ) -> Op:
        kind = inp[0]
        method, path, body, params = _request(self._ledger8, server, inp, self._revision.get(me))
        called = time.monotonic()
        status = code = revision = None
        out: tuple[Any, ...] | None = None
        try:
            r = await http.request(method, path, json=body, params=params)
            status = r.status_code
            data = (
                r.json() if r.headers.get("content-type", "").startswith("application/json") else {}
            )
            if status < 300:
                out, revision = _answer(kind, data)
            elif status < 500:
                code = data.get("code")
                out = ("err", code)
            else:
                code = data.get("code", f"http-{status}")
        except httpx.ConnectError:
            # Nothing reached a service (it is down): not an operation on the ledger.
            self.refused += 1
            self._count -= 1  # it does not count towards the history's length
            return Op(me, server, inp, None, called, time.monotonic())
        except (httpx.HTTPError, ValueError):
            pass
        returned = time.monotonic()
        if kind == "poll":
            inp = ("list",)  # a long poll is a read of the whole list, as a list is
        op = Op(me, server, inp, out, called, returned, status, code, revision)
        self.history.append(op)
        if out is not None and out[0] == "ok" and kind == "issue":
            gens = self._gens[server]
            if out[1] not in gens:
                gens.append(out[1])
                gens.sort()
        if revision is not None:
            self._revision[me] = max(revision, self._revision.get(me, 0))
        return op


def _request(
    ledger8: str, server: str, inp: tuple[Any, ...], since: int | None
) -> tuple[str, str, dict[str, Any] | None, dict[str, Any] | None]:
    kind = inp[0]
    listing = f"/v1/servers/{NAMESPACE}/{server}/epochs"
    if kind == "issue":
        body = {"namespace": NAMESPACE, "server": server, "request_uid": inp[1]}
        return "POST", "/v1/epochs", body, None
    if kind == "list":
        return "GET", listing, None, None
    if kind == "poll":
        return "GET", listing, None, {"since": since or 0, "wait": 0.3}
    epoch = f"{ledger8}-{inp[1]}"
    if kind == "bind":
        return "POST", f"/v1/epochs/{epoch}/bind", {"pod_name": "p", "pod_uid": inp[2]}, None
    if kind in ("drain", "retire"):
        return "POST", f"/v1/epochs/{epoch}/{kind}", None, None
    if kind == "incarnate":
        return "POST", f"/v1/epochs/{epoch}/incarnations", {}, None
    if kind == "get":
        return "GET", f"/v1/epochs/{epoch}", None, None
    raise ValueError(kind)


def _answer(kind: str, data: dict[str, Any]) -> tuple[tuple[Any, ...], int | None]:
    if kind == "issue":
        return ("ok", data["generation"]), None
    if kind in ("bind", "drain", "retire"):
        return ("ok", data["state"]), None
    if kind == "incarnate":
        return ("ok", data["incarnation"]), None
    if kind == "get":
        return ("ok", data["state"], data["incarnation"]), None
    shown = tuple(sorted((e["generation"], e["state"]) for e in data["epochs"]))
    return ("ok", shown), int(data["revision"])
