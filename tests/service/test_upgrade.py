"""A ledger written by release 0.1.0 opens under this release and keeps every epoch.

``fixtures/ledger-0.1.0.db`` was written by the 0.1.0 service code (how: the script next to
it): five epochs in every state, incarnations, and the generation counter at 5.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from tests.conftest import ServiceFactory

FIXTURE = Path(__file__).parent / "fixtures" / "ledger-0.1.0.db"
LEDGER_ID = "114f985ca7be46e3b51dd11b346c99f2"


def test_a_0_1_ledger_keeps_every_epoch_and_gains_addresses(
    service_factory: ServiceFactory, tmp_path: Path
) -> None:
    db = tmp_path / "old.db"
    shutil.copyfile(FIXTURE, db)
    svc = service_factory(f"sqlite:///{db}")
    listing = svc.client().get("/v1/servers/ns/echo/epochs").json()
    assert listing["ledger_id"] == LEDGER_ID and listing["revision"] == 14
    got = {e["epoch"]: (e["state"], e["pod_name"], e["incarnation"]) for e in listing["epochs"]}
    assert got == {
        "114f985c-1": ("live", "p0", 0),
        "114f985c-2": ("draining", "p1", 1),
        "114f985c-3": ("retired", "p2", None),
        "114f985c-4": ("abandoned", None, None),
        "114f985c-5": ("pending", None, None),
    }
    assert all(e["address"] is None for e in listing["epochs"])
    # The generation counter goes on from where 0.1 left it: never a repeat.
    assert svc.issue("ns", "echo", "after-upgrade") == "114f985c-6"
    # An old live epoch takes its address through a repeated bind of the same pod ...
    bound = svc.op(
        "/v1/epochs/114f985c-1/bind",
        {"pod_name": "p0", "pod_uid": "uid-0", "address": "10.1.2.3:8080"},
    )
    assert bound["address"] == "10.1.2.3:8080" and bound["state"] == "live"
    # ... and the upgraded file opens again unchanged (the upgrade is done once).
    svc.restart()
    again = svc.client().get("/v1/epochs/114f985c-1").json()
    assert again["address"] == "10.1.2.3:8080" and again["incarnation"] == 0
