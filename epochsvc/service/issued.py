"""What follows a durable issue, whichever route made it: one place, so an issue by the
single route, by its lean path (:mod:`.leanissue`) and by the pool's batch route wake the same
long polls and count the same."""

from __future__ import annotations

from collections.abc import Sequence

from epochsvc.service.longpoll import ChangeNotifier
from epochsvc.service.metrics import Metrics
from epochsvc.service.models import epoch_of
from epochsvc.service.store.base import EpochRecord, EpochStore
from mcp_epoch.api import Epoch, IssueRequest


def announce_issued(
    notifier: ChangeNotifier,
    metrics: Metrics,
    namespace: str,
    server: str,
    created: Sequence[EpochRecord],
) -> None:
    """Wake the server's long polls once, at the newest revision, and count the new epochs."""
    if created:
        notifier.notify_server(namespace, server, max(r.revision for r in created))
        metrics.issued.labels(namespace, server).inc(len(created))


async def issue_one(
    store: EpochStore, notifier: ChangeNotifier, metrics: Metrics, body: IssueRequest
) -> tuple[Epoch, bool]:
    """One admission's epoch, and whether this request made it (``False``: a repeat of its
    ``request_uid``, answered with the epoch the first one got)."""
    record, created = await store.issue(body.namespace, body.server, body.request_uid)
    if created:
        announce_issued(notifier, metrics, body.namespace, body.server, [record])
    return epoch_of(record), created
