"""How this process's drain ended, told to the epoch service as the process exits.

A process's ``/metrics`` leave with it, moments after its drain: Prometheus would rarely
scrape the outcome there. The epoch service outlives the process and counts the report
(``epochsvc_drains_total``, by server and outcome), which is what the alert on drains hitting
their deadline reads. Best effort and bounded: a report the service does not take at once is
logged and dropped; the exit is never held for more than :data:`REPORT_SECONDS`.
"""

from __future__ import annotations

import logging

import anyio
import httpx

from mcp_epoch import api
from mcp_epoch._internal.config import ReplicaConfig
from mcp_epoch.api_client import EpochServiceClient, EpochServiceError, EpochServiceUnavailable
from mcp_epoch.contract import ProcessEpoch

log = logging.getLogger("mcp_epoch")

#: The longest a report may hold the exit (one attempt, no retry: the process is leaving).
REPORT_SECONDS = 1.0


async def report_drain(
    config: ReplicaConfig, process_epoch: ProcessEpoch | None, report: api.DrainReport
) -> bool:
    """Send ``report`` for ``process_epoch`` (None: a fallback epoch the ledger never issued,
    nothing to report for). True if the service counted it."""
    if config.service_url is None or process_epoch is None:
        return False
    if config.pod_uid and report.pod_uid is None:
        report = report.model_copy(update={"pod_uid": config.pod_uid})
    call = api.report_drain(str(process_epoch), report)
    try:
        with anyio.fail_after(REPORT_SECONDS):
            async with EpochServiceClient(
                config.service_url, config.credential, timeout=REPORT_SECONDS
            ) as client:
                await client.once(call)
    except (EpochServiceError, EpochServiceUnavailable, httpx.HTTPError, TimeoutError) as exc:
        log.info("the drain's outcome was not reported to the epoch service: %s", exc)
        return False
    return True
