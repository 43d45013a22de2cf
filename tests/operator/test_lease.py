"""The admission lease (``mcp_epoch_operator.lease``) on the real API server: one holder at a
time, a takeover only after a whole lease duration unseen (or at once after a release), and a
tenure token that changes whenever the holding was interrupted.

Each candidate's clock is its own and set by the test, so expiry is decided without waiting
for it; the Lease object, its resource versions and the conflicts are the API server's own.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator, Iterator

import pytest
from mcp_epoch_operator import kube
from mcp_epoch_operator.lease import AdmissionLease, Seen, next_step

from tests.cluster.harness import Cluster
from tests.operator.support import make_namespace

pytestmark = [pytest.mark.cluster, pytest.mark.anyio]
DURATION = 4.0


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def namespace(k8s_cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    monkeypatch.setenv("KUBECONFIG", str(k8s_cluster.kubeconfig))
    yield make_namespace(k8s_cluster, "lease-tests")


@pytest.fixture
async def client(namespace: str) -> AsyncIterator[kube.KubeClient]:
    c = kube.KubeClient(kube.login)
    yield c
    await c.aclose()


def candidates(client: kube.KubeClient, namespace: str) -> tuple[AdmissionLease, ...]:
    name = f"admission-{secrets.token_hex(4)}"
    return tuple(
        AdmissionLease(client, namespace, name, who, f"10.0.0.{i}:9443", clock=Clock())
        for i, who in enumerate(("a", "b", "c"), start=1)
    )


def advance(lease: AdmissionLease, seconds: float) -> None:
    clock = lease.clock
    assert isinstance(clock, Clock)
    clock.now += seconds


def test_the_step_after_a_read() -> None:
    held_by_a = Seen("a", 0, "7", "10.0.0.1:9443")
    assert next_step(None, "b", 0, DURATION) == "create"
    assert next_step(held_by_a, "a", 0, DURATION) == "renew"
    assert next_step(held_by_a, "b", DURATION - 0.01, DURATION) == "wait"
    assert next_step(held_by_a, "b", DURATION, DURATION) == "take"
    assert next_step(Seen("", 3, "9", None), "b", 0, DURATION) == "take"


async def test_one_holder_and_the_others_know_where_it_is(
    client: kube.KubeClient, namespace: str
) -> None:
    a, b, _ = candidates(client, namespace)
    await a.round()
    await b.round()
    assert a.holds() and not b.holds()
    assert b.holder_address == a.address and a.holder_address == a.address
    token = a.tenure
    advance(a, 1.0)
    await a.round()  # a renewal continues the tenure
    assert a.holds() and a.tenure == token
    advance(a, DURATION)  # a holder that could not renew stops handing out by itself
    assert not a.holds()


async def test_a_silent_holder_is_replaced_only_after_a_whole_duration(
    client: kube.KubeClient, namespace: str
) -> None:
    a, b, _ = candidates(client, namespace)
    await a.round()
    await b.round()  # b starts watching the record
    advance(b, DURATION - 0.1)
    await b.round()
    assert not b.holds()  # a may still be handing out
    advance(b, 0.1)
    await b.round()
    assert b.holds()
    # a stopped handing out before b could take over: by a's own clock its validity ended a
    # margin before the duration others wait out.
    advance(a, DURATION - a.margin)
    assert not a.holds()
    await a.round()
    assert not a.holds() and a.tenure is None and a.holder_address == b.address


async def test_a_released_lease_is_taken_at_once_and_the_tenure_is_new(
    client: kube.KubeClient, namespace: str
) -> None:
    a, b, _ = candidates(client, namespace)
    await a.round()
    first = a.tenure
    await b.round()
    await a.release()
    assert not a.holds()
    await b.round()
    assert b.holds()
    await b.release()
    await a.round()
    assert a.holds() and a.tenure != first  # interrupted: its pool must start empty


async def test_of_two_takers_one_wins(client: kube.KubeClient, namespace: str) -> None:
    a, b, c = candidates(client, namespace)
    await a.round()
    for lease in (b, c):
        await lease.round()
        advance(lease, DURATION)
    # Both saw the same record unchanged for a whole duration, and take it at once: the
    # writes are at the version each read, so the API server lets one through.
    await asyncio.gather(b.round(), c.round())
    assert [b.holds(), c.holds()].count(True) == 1
    lease = await client.get_lease(namespace, a.name)
    assert lease is not None
    assert lease["spec"]["holderIdentity"] == ("b" if b.holds() else "c")


async def test_the_rounds_go_on_after_a_round_fails_unexpectedly(
    client: kube.KubeClient, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An error nobody foresaw in one round (injected: a fault the API server cannot be made
    to give on demand) must not end the rounds, or the process would never hand out again."""
    (a, *_) = candidates(client, namespace)
    real = client.get_lease
    failures = []

    async def once_broken(ns: str, name: str) -> dict[str, object] | None:
        if not failures:
            failures.append(name)
            raise RuntimeError("injected")
        return await real(ns, name)

    monkeypatch.setattr(client, "get_lease", once_broken)
    a.every = 0.01
    rounds = asyncio.create_task(a.run())
    try:
        for _ in range(100):
            if a.holds():
                break
            await a.changed(1.0)
    finally:
        rounds.cancel()
    assert failures == [a.name] and a.holds()
