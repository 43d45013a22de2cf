"""Ground truth and the per-call checker: did the client accept exactly what its server sent?

The demo's tool stamps every message it sends with a :class:`Token` naming the logical session
(a uid chosen by the client), the call, what the message is (a progress ``step``, a
server-to-client request ``ask``, the final ``done``) and its ordinal. The client therefore does
not have to trust event IDs or session IDs to know whether an event it accepted belonged to it:
a foreign token is an event of another session or call, a repeated ordinal is a duplicate, a
skipped ordinal is a missing event. This module is pure (no I/O, no clock), so it is unit-tested
on hand-made sequences.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

Kind = Literal["step", "ask", "done"]
#: Response header naming the replica process that produced an answer (a forward keeps it).
REPLICA_HEADER = "x-demo-replica"
_KINDS: frozenset[str] = frozenset({"step", "ask", "done"})
SEP = "|"
#: How many foreign acceptances a call keeps the text of (the count is always whole).
MAX_CROSSED = 5


@dataclass(frozen=True, slots=True)
class Token:
    """``uid|call|kind|n|replica``: who a message was for, what it was, and who sent it."""

    uid: str
    call: str
    kind: Kind
    n: int
    replica: str = ""

    def encode(self) -> str:
        return SEP.join((self.uid, self.call, self.kind, str(self.n), self.replica))

    @classmethod
    def parse(cls, text: str | None) -> Token | None:
        """The token in ``text``, or ``None`` when ``text`` is not one (never raises)."""
        if not text:
            return None
        parts = text.split(SEP)
        if len(parts) != 5 or parts[2] not in _KINDS or not parts[3].isdigit():
            return None
        kind: Kind = parts[2]  # type: ignore[assignment]
        return cls(parts[0], parts[1], kind, int(parts[3]), parts[4])


Outcome = Literal["pending", "completed", "rejected", "failed", "hung"]


@dataclass(slots=True)
class Reconnect:
    """One ``Last-Event-ID`` reconnect of a call's stream, as the client saw it."""

    same_process: bool | None  # None: the stream's origin was not known
    status: int
    forwarded: bool = False  # another replica took it and forwarded it to the owner
    lossless: bool | None = None  # decided by what the call accepts after it
    delivered: bool = False
    base: tuple[int, int, int] = (0, 0, 0)  # violations counted before it
    #: Served from the tail the stream's own process handed over with its session (under
    #: that process's IDs), by the process that holds the session now.
    from_tail: bool = False


@dataclass(slots=True)
class CallCheck:
    """Everything one call accepted, checked against the ground truth as it arrives.

    ``steps`` and ``asks`` are what the server will send for this call when nothing goes wrong:
    progress steps 1..steps and server-to-client requests 1..asks, then the result.
    """

    uid: str
    call: str
    steps: int
    asks: int
    last_step: int = 0
    last_ask: int = 0
    foreign: int = 0
    duplicated: int = 0
    missing: int = 0
    #: What the first few foreign acceptances were (``kind: text``), so a run's dump shows
    #: what crossed into this call, not only how many.
    crossed: list[str] = field(default_factory=list)
    outcome: Outcome = "pending"
    refused: bool = False  # the server answered the call's own POST with 404: it never ran
    #: A drop cut this client's connections while the call was pending and before any event
    #: of it arrived (its first POST or the retry after a refusal). Set by the scenario's
    #: chaos, which knows what it cut.
    dropped_early: bool = False
    error: str = ""  # what the client was told when the call failed
    #: Another request of the call's session that the server refused with 404 while the call
    #: was pending (the answer to its question, a ping, a standalone stream): the session is
    #: gone, so the call fails with it. ``"POST"`` or ``"GET"``, else empty.
    session_refused: str = ""
    reconnects: list[Reconnect] = field(default_factory=list)
    #: When the client started the call and when its wait for the answer ended, on the
    #: client's monotonic clock (the checker reads no clock; the client stamps both): what
    #: the report's timeline bins. ``ended_at`` stays ``None`` for a call still pending.
    started_at: float | None = None
    ended_at: float | None = None
    _open: Reconnect | None = None

    @property
    def clean(self) -> bool:
        return self.foreign == 0 and self.duplicated == 0 and self.missing == 0

    @property
    def _violations(self) -> tuple[int, int, int]:
        return (self.foreign, self.duplicated, self.missing)

    def _close(self, *, completed: bool = False) -> None:
        """Decide the open reconnect: lossless iff nothing wrong was accepted after it, and it
        delivered something (or the call completed); otherwise leave it undecided."""
        rc = self._open
        self._open = None
        if rc is not None and (rc.delivered or completed):
            rc.lossless = self._violations == rc.base

    def reconnected(
        self,
        same_process: bool | None,
        status: int,
        *,
        forwarded: bool = False,
        from_tail: bool = False,
    ) -> None:
        """A reconnect with ``Last-Event-ID`` was answered with ``status``. Whether it resumed
        losslessly is decided by what the call accepts next; a reconnect followed by nothing
        but another reconnect stays undecided (``None``)."""
        self._close()
        rc = Reconnect(same_process, status, forwarded, base=self._violations, from_tail=from_tail)
        self.reconnects.append(rc)
        if status < 300:
            self._open = rc

    def accept(self, text: str | None, kind: Kind) -> None:
        """The client accepted a message of ``kind`` whose ground truth is ``text``."""
        token = Token.parse(text)
        if self._open is not None:
            self._open.delivered = True
        if token is None or token.uid != self.uid or token.call != self.call or token.kind != kind:
            self._foreign(kind, text)
        elif kind == "done":
            if token.n != self.steps:
                self._foreign(kind, text)  # a result of a call with another shape is not ours
        else:
            last = self.last_step if kind == "step" else self.last_ask
            if token.n <= last:
                self.duplicated += 1
            else:
                self.missing += token.n - last - 1
                if kind == "step":
                    self.last_step = token.n
                else:
                    self.last_ask = token.n

    def _foreign(self, kind: Kind, text: str | None) -> None:
        self.foreign += 1
        if len(self.crossed) < MAX_CROSSED:
            self.crossed.append(f"{kind}: {text if text is None else text[:200]}")

    def failed_with(self, exc: BaseException) -> None:
        self.error = repr(exc)[:300]
        self.finish("failed")

    @property
    def cut_before_first_event(self) -> bool:
        """Failed because a drop cut its connection before the first event arrived: no cursor
        to resume from, and no way for the client to know whether the server got the call, so
        no client may retry it. Random drops cause these, with or without a deploy. Only a
        drop the scenario made counts; a connection a replica broke is never excused."""
        return (
            self.outcome == "failed"
            and self.dropped_early
            and not self.reconnects
            and self.last_step == 0
            and self.last_ask == 0
        )

    def drop_hit(self) -> None:
        """A drop cut connections of this client while this call was pending."""
        if self.outcome == "pending" and self.last_step == 0 and self.last_ask == 0:
            self.dropped_early = True

    def finish(self, outcome: Outcome) -> None:
        """The call ended. Only a completed call must have seen everything; a rejected or
        failed call was told it failed, so its events need only be a clean prefix. A hung
        call's resumptions all failed: none of them brought the answer."""
        self.outcome = outcome
        if outcome == "completed":
            self.missing += max(0, self.steps - self.last_step) + max(0, self.asks - self.last_ask)
            self._close(completed=True)
        elif outcome == "hung":
            self._open = None
            for rc in self.reconnects:
                if rc.status < 300 and rc.lossless is None:
                    rc.lossless = False
        else:
            self._close()


@dataclass(slots=True)
class Tally:
    """Per-fleet totals folded from sessions and calls."""

    sessions: int = 0
    corrupted_sessions: int = 0
    calls: int = 0
    completed: int = 0
    rejected_calls: int = 0
    failed_calls: int = 0
    hung: int = 0
    foreign: int = 0
    duplicated: int = 0
    missing: int = 0
    reconnects: int = 0
    same_process: int = 0
    cross_process: int = 0
    reconnects_rejected: int = 0
    reconnects_failed: int = 0
    cross_process_resumed: int = 0
    lossless: int = 0
    lossy: int = 0
    undecided: int = 0
    same_process_lossless: int = 0
    same_process_lossy: int = 0
    forwarded_reconnects: int = 0
    #: Reconnects served from a handed-over tail, and how many of them were lossless.
    tail_resumed: int = 0
    tail_lossless: int = 0
    tail_lossy: int = 0
    #: Sessions in which a call did not complete: what the user of the session noticed.
    broken_sessions: int = 0
    #: Calls that failed after they had started (their owner died with them): never retried.
    lost_in_flight: int = 0
    #: Calls the server refused before they ran (404 on their own POST).
    refused_calls: int = 0
    #: Calls whose connection a drop cut before their first event (see CallCheck).
    cut_before_first_event: int = 0

    def add_session(self, calls: list[CallCheck]) -> None:
        self.sessions += 1
        if any(not c.clean for c in calls):
            self.corrupted_sessions += 1
        if any(c.outcome != "completed" for c in calls):
            self.broken_sessions += 1
        for c in calls:
            self.add_call(c)

    def add_call(self, c: CallCheck) -> None:
        self.calls += 1
        self.completed += c.outcome == "completed"
        self.rejected_calls += c.outcome == "rejected"
        self.failed_calls += c.outcome == "failed"
        self.hung += c.outcome in ("hung", "pending")
        self.refused_calls += (
            c.outcome != "completed" and c.refused and not c.cut_before_first_event
        )
        self.cut_before_first_event += c.cut_before_first_event
        self.lost_in_flight += (
            c.outcome in ("failed", "rejected") and not c.refused and not c.cut_before_first_event
        )
        self.foreign += c.foreign
        self.duplicated += c.duplicated
        self.missing += c.missing
        for rc in c.reconnects:
            self.reconnects += 1
            self.same_process += rc.same_process is True and not rc.forwarded
            self.forwarded_reconnects += rc.forwarded
            self.cross_process += rc.same_process is False
            if rc.status == 404:
                self.reconnects_rejected += 1
                continue
            if rc.status >= 300:
                self.reconnects_failed += 1
                continue
            if rc.from_tail:
                self.tail_resumed += 1
                self.tail_lossless += rc.lossless is True
                self.tail_lossy += rc.lossless is False
            else:
                self.cross_process_resumed += rc.same_process is False
            if rc.lossless is True:
                self.lossless += 1
                self.same_process_lossless += rc.same_process is True
            elif rc.lossless is False:
                self.lossy += 1
                self.same_process_lossy += rc.same_process is True
            else:
                self.undecided += 1
