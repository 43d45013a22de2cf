"""The library's ring codec in-process, over the SDK's own AES-GCM codec: a state opens on any
process holding a ring with its key, keeps opening through a rotation's phases, and is refused
the SDK's way (and counted by reason) once its key has left the ring."""

from __future__ import annotations

import pytest
from mcp.server.request_state import InvalidRequestState

from mcp_epoch._internal.config import ReplicaConfig
from mcp_epoch._internal.keyring import RingCodec, RingFollower
from mcp_epoch.contract import ENV_DRAIN, ENV_RING_REFRESH

OLD, NEW = b"o" * 32, b"n" * 32


def codec(revision: int, *keys: bytes) -> RingCodec:
    c = RingCodec()
    c.install(revision, list(keys))
    return c


def test_a_state_opens_on_every_holder_of_its_key_through_the_phases() -> None:
    sealer = codec(1, OLD)
    token = sealer.seal(b"state")
    adding, switching = codec(2, OLD, NEW), codec(3, NEW, OLD)
    assert adding.unseal(token) == switching.unseal(token) == b"state"
    assert adding.seal(b"x") != switching.seal(b"x")
    assert codec(1, OLD).unseal(adding.seal(b"a")) == b"a"  # adding still seals with OLD
    assert codec(4, NEW).unseal(switching.seal(b"s")) == b"s"  # switching seals with NEW


def test_a_key_that_left_the_ring_is_refused_and_counted() -> None:
    token = codec(1, OLD).seal(b"state")
    steady = codec(4, NEW)
    with pytest.raises(InvalidRequestState, match="unknown key"):
        steady.unseal(token)
    with pytest.raises(InvalidRequestState, match="malformed"):
        steady.unseal("v1.not-base64!")
    assert steady.rejected == {"unknown_key": 1, "malformed": 1}


def test_nothing_is_sealed_before_a_ring_is_loaded() -> None:
    empty = RingCodec()
    assert empty.revision == 0
    with pytest.raises(RuntimeError, match="no request-state ring"):
        empty.seal(b"state")
    with pytest.raises(InvalidRequestState):
        empty.unseal(codec(1, OLD).seal(b"state"))


def test_metrics_name_every_reason_and_never_a_key() -> None:
    follower = RingFollower(ReplicaConfig.from_env({}), codec(7, OLD))
    text = "\n".join(follower.metrics())
    assert "mcp_epoch_request_state_ring_revision 7" in text
    for reason in ("unknown_key", "malformed", "seal"):
        assert f'mcp_epoch_request_state_rejected_total{{reason="{reason}"}} 0' in text
    assert "ooo" not in text
    assert not follower.enabled  # no epoch service in this environment


def test_the_refresh_interval_is_read_like_the_drain_and_a_bad_one_fails_loudly() -> None:
    assert ReplicaConfig.from_env({}).ring_refresh_seconds == 5.0
    assert ReplicaConfig.from_env({ENV_RING_REFRESH: " 0.2 "}).ring_refresh_seconds == 0.2
    assert ReplicaConfig.from_env({ENV_DRAIN: "0"}).drain_seconds == 0.0  # no drain: allowed
    for bad in ("0", "-1", "3601", "soon"):
        with pytest.raises(ValueError, match=ENV_RING_REFRESH):
            ReplicaConfig.from_env({ENV_RING_REFRESH: bad})
    with pytest.raises(ValueError, match=r"outside 0\.\.3600"):
        ReplicaConfig.from_env({ENV_DRAIN: "3601"})
