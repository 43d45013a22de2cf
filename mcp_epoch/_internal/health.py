"""What ``/readyz`` and ``/metrics`` of an epoch-safe server report (a probe, Prometheus).

Readiness fails while the process cannot act safely on its own: before it has started, while
the epoch service refuses its credentials (its copy of the ledger is then frozen: it would
classify cursors from an old picture), and while it drains. The metrics are a few counters in
the Prometheus text format, written by hand: the library depends on no metrics client.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from mcp_epoch._internal.keyring import RingFollower
from mcp_epoch._internal.liveview import LiveEpochView


@dataclass(frozen=True, slots=True)
class Health:
    started: bool
    draining: bool
    view: LiveEpochView | None
    forwarded: int
    registered: bool
    ring: RingFollower | None = None
    handed: int = 0
    adopted: int = 0
    served_handed: int = 0
    tail_replays: int = 0
    #: What the adapter finds wrong (the sidecar: its upstream does not answer).
    extra: tuple[str, ...] = ()
    extra_metrics: tuple[str, ...] = ()
    #: This process's epoch ("" before it has one): a probe's answer names who answered.
    epoch: str = ""

    @property
    def problems(self) -> list[str]:
        found = []
        if not self.started:
            found.append("not started: the process epoch is not known yet")
        if self.view is not None and self.view.refused:
            found.append(
                "the epoch service refuses this pod's credentials: "
                f"{self.view.last_error or 'no detail'}"
            )
        if self.ring is not None and not self.ring.loaded:
            found.append(
                "the request-state ring is not loaded yet: "
                f"{self.ring.last_error or 'waiting for the epoch service'}"
            )
        found.extend(self.extra)
        if self.draining:
            found.append("draining: finishing the calls in flight before exit")
        return found

    def readiness(self) -> tuple[int, bytes]:
        problems = self.problems
        body = {"ready": not problems, "problems": problems, "epoch": self.epoch}
        return (503 if problems else 200), json.dumps(body).encode()

    def metrics(self) -> bytes:
        view = self.view
        lines = [
            "# HELP mcp_epoch_ready 1 while /readyz answers 200.",
            "# TYPE mcp_epoch_ready gauge",
            f"mcp_epoch_ready {0 if self.problems else 1}",
            "# HELP mcp_epoch_registered 1 if this process's epoch was issued by the ledger, "
            "0 for a fallback epoch.",
            "# TYPE mcp_epoch_registered gauge",
            f"mcp_epoch_registered {int(self.registered)}",
            "# HELP mcp_epoch_credentials_refused 1 while the epoch service refuses this "
            "pod's credentials.",
            "# TYPE mcp_epoch_credentials_refused gauge",
            f"mcp_epoch_credentials_refused {int(bool(view and view.refused))}",
            "# HELP mcp_epoch_credentials_refused_total Ledger polls refused for credentials.",
            "# TYPE mcp_epoch_credentials_refused_total counter",
            f"mcp_epoch_credentials_refused_total {view.refusals if view else 0}",
            "# HELP mcp_epoch_forwarded_total Requests handed to the process owning them.",
            "# TYPE mcp_epoch_forwarded_total counter",
            f"mcp_epoch_forwarded_total {self.forwarded}",
            "# HELP mcp_epoch_sessions_handed_off_total Sessions this process handed on to a "
            "live peer while it drained.",
            "# TYPE mcp_epoch_sessions_handed_off_total counter",
            f"mcp_epoch_sessions_handed_off_total {self.handed}",
            "# HELP mcp_epoch_sessions_adopted_total Sessions this process took from a "
            "draining peer.",
            "# TYPE mcp_epoch_sessions_adopted_total counter",
            f"mcp_epoch_sessions_adopted_total {self.adopted}",
            "# HELP mcp_epoch_handed_session_requests_total Requests served on sessions taken "
            "from a draining peer.",
            "# TYPE mcp_epoch_handed_session_requests_total counter",
            f"mcp_epoch_handed_session_requests_total {self.served_handed}",
            "# HELP mcp_epoch_tail_replays_total Cursors of an earlier owner served from the "
            "tail it handed over.",
            "# TYPE mcp_epoch_tail_replays_total counter",
            f"mcp_epoch_tail_replays_total {self.tail_replays}",
        ]
        if self.ring is not None:
            lines.extend(self.ring.metrics())
        lines.extend(self.extra_metrics)
        return ("\n".join(lines) + "\n").encode()
