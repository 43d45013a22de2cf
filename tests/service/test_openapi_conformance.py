"""The OpenAPI document says exactly what the service does: a bounded schemathesis run.

Every operation is generated from the document (its coverage and fuzzing phases) and sent to
a real service process as the operator; every check must pass, 5xx included. The stateful
phase and the reuse of values seen in responses are left out (``schemathesis.toml`` here):
both pass an epoch's ``process_epoch`` on, and for an epoch with no process yet that value is
null, which becomes the path segment ``null``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import ServiceFactory

#: Fixed, so a failure is reproducible; set MCP_EPOCH_SCHEMATHESIS_SEED to explore others.
SEED = int(os.environ.get("MCP_EPOCH_SCHEMATHESIS_SEED", "20261203"))


def test_the_service_does_what_its_openapi_document_says(
    service_factory: ServiceFactory, sqlite_url: str
) -> None:
    # Long polls held for a second at most, so a generated wait of an hour ends quickly.
    svc = service_factory(sqlite_url, EPOCHSVC_MAX_WAIT_SECONDS="1")
    st = Path(sys.executable).with_name("st")
    argv = [
        str(st),
        "--config-file",
        str(Path(__file__).with_name("schemathesis.toml")),
        "run",
        f"{svc.url}/openapi.json",
        "--header",
        f"Authorization: Bearer {svc.operator_token}",
        "--checks",
        "all",
        "--phases",
        "coverage,fuzzing",
        "--max-examples",
        "25",
        "--seed",
        str(SEED),
        "--request-timeout",
        "10",
        "--no-color",
    ]
    print(f"schemathesis seed {SEED}")
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    report = done.stdout + done.stderr
    assert done.returncode == 0, f"seed {SEED}:\n{report[-6000:]}"
    assert "Test cases:" in report and "generated" in report, report[-2000:]
