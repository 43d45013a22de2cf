"""The webhook never admits a labelled pod without its epoch, even if its own bookkeeping fails."""

from __future__ import annotations

import kopf
import pytest
from mcp_epoch_operator.handlers import CURRENT_REQUEST, recorded_request


def test_a_missing_admission_request_refuses_the_pod() -> None:
    # The server records each request in a context variable before kopf runs the handler;
    # a handler that runs without it (a kopf change, a task outside that context) refuses.
    with pytest.raises(kopf.AdmissionError) as info:
        recorded_request()
    assert info.value.code == 500
    assert "refused rather than run without" in str(info.value)


def test_the_recorded_request_is_the_one_served() -> None:
    request = {"uid": "req-1", "namespace": "ns", "object": {"metadata": {}}}
    token = CURRENT_REQUEST.set(request)
    try:
        assert recorded_request() is request
    finally:
        CURRENT_REQUEST.reset(token)
