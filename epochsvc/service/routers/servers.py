"""``/v1/servers/{namespace}/{server}/epochs``: a server's epochs, with a long poll."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Hashable
from dataclasses import dataclass
from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query, Response

from epochsvc.service.access import shown
from epochsvc.service.auth import AnyCaller, Caller, Operator
from epochsvc.service.deps import Config, Lists, MetricsDep, Notifier, Rules, Store, json_body
from epochsvc.service.held import HeldResponse
from epochsvc.service.issued import announce_issued
from epochsvc.service.lifecycle import State
from epochsvc.service.listings import ListKey, RenderedLists
from epochsvc.service.longpoll import Answer, ChangeNotifier
from epochsvc.service.models import epoch_of
from epochsvc.service.settings import Settings
from epochsvc.service.store import EpochStore
from mcp_epoch.api import EpochList, ErrorBody, IssueBatchRequest, IssuedEpochs
from mcp_epoch.contract import DNS1123_LABEL_PATTERN

router = APIRouter(
    prefix="/v1/servers",
    tags=["servers"],
    responses={code: {"model": ErrorBody} for code in (401, 403, 422, 503)},
)

NameParam = Annotated[str, Path(pattern=rf"^{DNS1123_LABEL_PATTERN}$", max_length=63)]
#: A long poll's two parameters, one definition for every long poll of the API.
SinceParam = Annotated[int | None, Query(ge=0, description="a revision from an earlier answer")]
WaitParam = Annotated[
    float, Query(ge=0, le=3600, description="with since: hold up to this many seconds")
]


def held_seconds(since: int | None, wait: float, settings: Settings) -> float | None:
    """How long a long poll with these parameters is held (None: it is answered at once),
    capped by the service's ``max_wait_seconds``: one rule for every long poll."""
    if since is None or wait <= 0:
        return None
    return min(wait, settings.max_wait_seconds)


def held_poll(
    notifier: ChangeNotifier,
    store: EpochStore,
    namespace: str,
    server: str,
    since: int,
    held: float,
    answer: Answer,
    share: Hashable,
) -> HeldResponse:
    """A long poll held until the server changes (:meth:`ChangeNotifier.begin`), then answered
    outside the framework's frames (:mod:`epochsvc.service.held`): one shape for every one."""
    begin = functools.partial(notifier.begin, store, namespace, server, since, held, answer, share)
    return HeldResponse(begin, media_type="application/json")


@router.get("/{namespace}/{server}/epochs", response_model=EpochList)
async def list_epochs(
    namespace: NameParam,
    server: NameParam,
    store: Store,
    notifier: Notifier,
    lists: Lists,
    settings: Config,
    rules: Rules,
    caller: AnyCaller,
    state: Annotated[list[State] | None, Query(description="keep only these states")] = None,
    since: SinceParam = None,
    wait: WaitParam = 0.0,
) -> Response:
    """All epochs of a server (tombstones too until compacted) and the ledger revision they are
    consistent with. With ``since`` and ``wait`` the answer is held until a change newer than
    ``since`` exists for this server or the wait ends; it is the full list either way. A pod
    reads only its own server's epochs."""
    await rules.check_read(caller, namespace, server)
    filters = tuple(state or ())
    key = lists.key(store.ledger_id, namespace, server, filters, caller.is_operator)
    read = _EpochsRead(store, lists, notifier, caller, namespace, server, filters, key)
    held = held_seconds(since, wait, settings)
    if held is not None:
        assert since is not None  # held_seconds holds only a poll with a since
        # Waiters of the same list (its key) share one answer per change.
        return held_poll(notifier, store, namespace, server, since, held, read.answer, key)
    return Response(await read.listing(), media_type="application/json")


@dataclass(slots=True)
class _EpochsRead:
    """One caller's read of a server's epochs, and its long poll's answer.

    One small object is what a held poll keeps while it waits (closures kept a cell per
    variable), since thousands of them are freed at once when one change wakes them."""

    store: EpochStore
    lists: RenderedLists
    notifier: ChangeNotifier
    caller: Caller
    namespace: str
    server: str
    filters: tuple[State, ...]
    key: ListKey

    async def listing(self) -> bytes:
        store, caller = self.store, self.caller
        snapshot = await store.list_server(self.namespace, self.server, self.filters)

        def render() -> bytes:
            body = EpochList(
                ledger_id=store.ledger_id,
                revision=snapshot.revision,
                epochs=[epoch_of(shown(r, caller)) for r in snapshot.epochs],
            )
            return body.model_dump_json().encode()

        return self.lists.get(self.key, snapshot.revision, render)

    def answer(self, woken_by: int | None) -> Awaitable[bytes]:
        """A held poll's answer (:meth:`ChangeNotifier.begin`): once woken by notification
        ``woken_by``, the read its fellow waiters share; else a read of its own."""
        if woken_by is None:
            return self.listing()
        return self.lists.after_change(self.key, woken_by, self.notifier.changes, self.listing)


@router.post(
    "/{namespace}/{server}/epochs",
    response_model=IssuedEpochs,
    dependencies=[Depends(json_body)],
    responses={code: {"model": ErrorBody} for code in (409, 413, 415)},
)
async def issue_epochs(
    namespace: NameParam,
    server: NameParam,
    body: IssueBatchRequest,
    store: Store,
    notifier: Notifier,
    metrics: MetricsDep,
    _: Operator,
) -> IssuedEpochs:
    """Issue a pod epoch of this server per request UID, each idempotent on its UID, answered
    once every one is durable: the operator's pool of epochs issued ahead of admissions. The
    issues are written together (one group commit), so one call costs about what one issue
    does."""
    issued = await asyncio.gather(*(store.issue(namespace, server, u) for u in body.request_uids))
    created = [record for record, made in issued if made]
    announce_issued(notifier, metrics, namespace, server, created)
    records = sorted((record for record, _ in issued), key=lambda r: r.generation)
    return IssuedEpochs(epochs=[epoch_of(r) for r in records])
