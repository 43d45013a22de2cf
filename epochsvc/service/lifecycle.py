"""The pod-epoch lifecycle as plain rules, so the store, the API and the tests share one truth.

``pending → live → draining → retired`` and ``pending → abandoned``. Incarnations (process
starts) may be registered while a pod epoch is pending or live; a pod registering for itself
must wait until its epoch is bound to its UID (``not-bound``, retryable), because before that
nothing proves the epoch is its own. A legal repeat (the same transition again, with the same
pod) is a no-op; anything else that does not fit is an illegal transition.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Final


class State(StrEnum):
    PENDING = "pending"
    LIVE = "live"
    DRAINING = "draining"
    RETIRED = "retired"
    ABANDONED = "abandoned"


TOMBSTONES = frozenset({State.RETIRED, State.ABANDONED})


class Action(StrEnum):
    BIND = "bind"
    DRAIN = "drain"
    RETIRE = "retire"
    ABANDON = "abandon"


# action -> (states it may start from, state it leads to)
_RULES: dict[Action, tuple[frozenset[State], State]] = {
    Action.BIND: (frozenset({State.PENDING}), State.LIVE),
    Action.DRAIN: (frozenset({State.LIVE}), State.DRAINING),
    Action.RETIRE: (frozenset({State.LIVE, State.DRAINING}), State.RETIRED),
    Action.ABANDON: (frozenset({State.PENDING}), State.ABANDONED),
}
INCARNATION_STATES = frozenset({State.PENDING, State.LIVE})


class LifecycleError(Exception):
    """A request the lifecycle forbids; ``code`` is stable for API clients."""

    def __init__(self, code: str, message: str, status: int = 409) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status


@dataclass(frozen=True, slots=True)
class Step:
    """What a transition does: ``None`` target means a no-op."""

    target: State | None


def plan(
    epoch: str,
    state: State,
    action: Action,
    *,
    bound_uid: str | None = None,
    pod_uid: str | None = None,
) -> Step:
    """Decide what ``action`` does to an epoch in ``state`` (raises LifecycleError if illegal)."""
    sources, target = _RULES[action]
    if action is Action.BIND and bound_uid is not None and pod_uid != bound_uid:
        raise LifecycleError(
            "pod-mismatch",
            f"epoch {epoch} is bound to pod UID {bound_uid}, not {pod_uid}; "
            "each pod gets its own epoch at admission",
        )
    if state is target:
        return Step(None)
    if action is Action.BIND and state in (State.DRAINING, State.RETIRED):
        # A late bind of the pod that this epoch already belonged to changes nothing.
        return Step(None)
    if state not in sources:
        allowed = ", ".join(sorted(s.value for s in sources))
        raise LifecycleError(
            "illegal-transition",
            f"cannot {action.value} epoch {epoch}: it is {state.value} "
            f"({action.value} needs {allowed})",
        )
    return Step(target)


def check_incarnation(epoch: str, state: State) -> None:
    if state not in INCARNATION_STATES:
        raise LifecycleError(
            "illegal-transition",
            f"cannot register a process start for epoch {epoch}: it is {state.value}; "
            "a pod epoch takes new incarnations only while pending or live",
        )


def check_owner(epoch: str, bound_uid: str | None, claimed_uid: str) -> None:
    """A registration on behalf of pod ``claimed_uid``: the epoch must be bound to it. The
    message names no UID, so a wrong guess teaches the caller nothing."""
    if bound_uid is None:
        raise LifecycleError(
            "not-bound",
            f"epoch {epoch} is not bound to a pod yet; retry once the operator has seen the pod",
        )
    if bound_uid != claimed_uid:
        raise LifecycleError(
            "not-your-epoch", f"epoch {epoch} is not bound to the calling pod", status=403
        )


#: States in which a process may hand its sessions on (it is draining, or about to be).
HANDOFF_STATES: Final = frozenset({State.LIVE, State.DRAINING})


def check_handoff(
    epoch: str,
    state: State,
    newest: int | None,
    incarnation: int,
    recorded: tuple[str | None, int | None],
    successor: str,
) -> bool:
    """May process ``incarnation`` of ``epoch`` (in ``state``, whose newest incarnation is
    ``newest``, with the rule ``recorded`` = (successor, successor_of)) record that its sessions
    go to ``successor``? False: that very rule is recorded already (a no-op). The successor's
    own checks are :func:`check_successor`'s."""
    if state not in HANDOFF_STATES:
        raise LifecycleError(
            "illegal-transition",
            f"epoch {epoch} is {state.value}: only a live or draining process hands sessions on",
        )
    if newest is None or incarnation != newest:
        raise LifecycleError(
            "stale-incarnation",
            f"process {epoch}.{incarnation} is not the newest process of {epoch}",
        )
    if recorded == (successor, incarnation):
        return False
    if recorded[0] is not None:
        raise LifecycleError(
            "handoff-recorded",
            f"process {epoch}.{recorded[1]} already hands its sessions to {recorded[0]}; "
            "a rule is recorded once",
        )
    return True


def check_successor(
    epoch: str,
    server: tuple[str, str],
    successor: str,
    successor_server: tuple[str, str],
    successor_state: State,
    successor_newest: int | None,
    successor_incarnation: int,
) -> None:
    """Sessions go only to a live process (the newest of its pod) of the same server, in
    another pod."""
    if successor.rsplit(".", 1)[0] == epoch:
        raise LifecycleError("illegal-handoff", f"{successor} is a process of {epoch} itself")
    if successor_server != server:
        raise LifecycleError(
            "illegal-handoff",
            f"{successor} serves another server: sessions move only within one server",
            status=403,
        )
    if successor_state is not State.LIVE or successor_newest != successor_incarnation:
        raise LifecycleError(
            "illegal-handoff",
            f"{successor} is not a live process (its epoch is {successor_state.value}); "
            "pick a live peer from the server's epochs",
        )
