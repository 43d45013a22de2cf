"""What follows a durable issue, whichever route made it: one place, so an issue by the
single route and by the pool's batch route wake the same long polls and count the same."""

from __future__ import annotations

from collections.abc import Sequence

from epochsvc.service.longpoll import ChangeNotifier
from epochsvc.service.metrics import Metrics
from epochsvc.service.store.base import EpochRecord


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
