"""Two network namespaces this test makes itself, one for a service process and one for its
database, joined by a veth pair: a partition is then two ``iptables`` rules inside the
service's namespace that drop everything to and from the database, silently, as a broken
network does. Nothing of the host's own network is touched; the test process reaches the
service through a Unix socket (:mod:`tests.robustness.relay`).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

SERVICE_ADDRESS = "10.231.0.1"
DATABASE_ADDRESS = "10.231.0.2"


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


@dataclass
class Namespaces:
    service: str
    database: str

    def run(self, ns: str, *argv: str) -> None:
        subprocess.run(["ip", "netns", "exec", ns, *argv], check=True, capture_output=True)

    def _rules(self, verb: str) -> None:
        for chain, way in (("OUTPUT", "-d"), ("INPUT", "-s")):
            self.run(self.service, "iptables", verb, chain, way, DATABASE_ADDRESS, "-j", "DROP")

    def cut(self) -> None:
        """Drop every packet between the service and the database, both ways."""
        self._rules("-A")

    def heal(self) -> None:
        self._rules("-D")

    @contextlib.contextmanager
    def relay(self, port: int, path: Path) -> Iterator[str]:
        """A Unix socket at ``path`` that reaches the service's ``port`` in its namespace."""
        proc = subprocess.Popen(
            ["ip", "netns", "exec", self.service, sys.executable, "-m",
             "tests.robustness.relay", str(path), f"127.0.0.1:{port}"],
            stdout=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        try:
            assert proc.stdout is not None
            if proc.stdout.readline().strip() != "relaying":
                raise RuntimeError("the relay into the service's namespace did not start")
            yield str(path)
        finally:
            proc.kill()
            proc.wait(10)


@contextlib.contextmanager
def namespaces() -> Iterator[Namespaces]:
    """Make the two namespaces and their link; remove them (and so the link) at the end."""
    tag = f"mcpe{os.getpid()}"
    ns = Namespaces(f"{tag}-svc", f"{tag}-db")
    made: list[str] = []
    try:
        for name in (ns.service, ns.database):
            _ip("netns", "add", name)
            made.append(name)
            ns.run(name, "ip", "link", "set", "lo", "up")
        _ip("link", "add", f"{tag}s", "netns", ns.service, "type", "veth",
            "peer", "name", f"{tag}d", "netns", ns.database)  # fmt: skip
        for name, dev, address in (
            (ns.service, f"{tag}s", SERVICE_ADDRESS),
            (ns.database, f"{tag}d", DATABASE_ADDRESS),
        ):
            ns.run(name, "ip", "addr", "add", f"{address}/30", "dev", dev)
            ns.run(name, "ip", "link", "set", dev, "up")
        yield ns
    finally:
        for name in made:
            with contextlib.suppress(subprocess.CalledProcessError):
                _ip("netns", "del", name)
