"""A real PostgreSQL server for the tests: initdb into a temporary folder, run on loopback.

PostgreSQL refuses to run as root, so as root the server runs as the ``postgres`` user that
Debian's package creates.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from tests.support.ports import free_port


def _bin(name: str) -> str:
    found = shutil.which(name)
    if found:
        return found
    for root in sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True):
        if (root / name).exists():
            return str(root / name)
    raise RuntimeError(
        f"PostgreSQL's {name} is not installed: run `apt-get install -y postgresql` "
        "(.ci/run does this)"
    )


class PostgresServer:
    def __init__(self, *, host: str = "127.0.0.1", netns: str | None = None) -> None:
        """``netns``: run the server (and the tools that reach it) in that network
        namespace, listening on ``host``."""
        self.dir = Path(tempfile.mkdtemp(prefix="mcp-epoch-pg-"))
        self.data = self.dir / "data"
        self.host = host
        self._in_ns = ["ip", "netns", "exec", netns] if netns else []
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self._user = "postgres" if os.geteuid() == 0 else None
        self._dbs = 0

    def _run_as(self, argv: list[str]) -> list[str]:
        as_user = ["runuser", "-u", self._user, "--", *argv] if self._user else argv
        return [*self._in_ns, *as_user]

    def start(self) -> PostgresServer:
        if self._user:
            pw = pwd.getpwnam(self._user)
            os.chown(self.dir, pw.pw_uid, pw.pw_gid)
        subprocess.run(
            self._run_as(
                [
                    _bin("initdb"),
                    "-D",
                    str(self.data),
                    "-U",
                    "postgres",
                    "--auth=trust",
                    "-E",
                    "UTF8",
                    "--no-sync",
                ]
            ),
            check=True,
            capture_output=True,
        )
        if self.host != "127.0.0.1":  # clients come from the namespace's own subnet
            with (self.data / "pg_hba.conf").open("a") as hba:
                hba.write("host all all samenet trust\n")
        return self.launch()

    def launch(self) -> PostgresServer:
        """Run the server on its data directory (again, after :meth:`kill`) and wait until it
        accepts connections."""
        log = (self.dir / "postgres.log").open("ab")
        self.proc = subprocess.Popen(
            self._run_as(
                [
                    _bin("postgres"),
                    "-D",
                    str(self.data),
                    "-p",
                    str(self.port),
                    "-c",
                    f"listen_addresses={self.host}",
                    "-c",
                    f"unix_socket_directories={self.dir}",
                    "-c",
                    "max_connections=200",
                    "-c",
                    "fsync=on",
                ]
            ),
            stdout=log,
            stderr=log,
        )
        deadline = time.monotonic() + 30
        while True:
            ok = subprocess.run(
                [*self._in_ns, _bin("pg_isready"), "-h", self.host, "-p", str(self.port)],
                capture_output=True,
            )
            if ok.returncode == 0:
                return self
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"PostgreSQL did not start:\n{self.log_tail()}")
            time.sleep(0.2)

    def log_tail(self) -> str:
        try:
            return "\n".join((self.dir / "postgres.log").read_text().splitlines()[-30:])
        except OSError:
            return "(no log)"

    def _psql(self, *args: str) -> subprocess.CompletedProcess[str]:
        """``psql`` as the superuser on this server (quiet), with ``args``."""
        base = [*self._in_ns, _bin("psql"), "-h", self.host, "-p", str(self.port)]
        base += ["-U", "postgres", "-q"]
        return subprocess.run([*base, *args], capture_output=True, text=True)

    def new_database(self) -> str:
        """A fresh, empty database; returns its URL."""
        self._dbs += 1
        name = f"ledger{self._dbs}"
        self._psql("-c", f"CREATE DATABASE {name}").check_returncode()
        return f"postgresql://postgres@{self.host}:{self.port}/{name}"

    def load(self, url: str, dump: Path) -> None:
        """Run a SQL dump (``pg_dump``'s plain format) into the database at ``url``."""
        database = url.rsplit("/", 1)[1]
        done = self._psql("-v", "ON_ERROR_STOP=1", "-d", database, "-f", str(dump))
        if done.returncode != 0:
            raise RuntimeError(f"psql -f {dump} failed: {done.stderr.strip()}")

    def drop_connections(self, url: str) -> None:
        """Close every connection to the database at ``url`` from the server's side, as its
        restart would, while the server stays up."""
        database = url.rsplit("/", 1)[1]
        self._psql(
            "-c",
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            f" WHERE datname = '{database}' AND pid <> pg_backend_pid()",
        ).check_returncode()

    def _postmaster_pid(self) -> int:
        """The server's own PID (``self.proc`` may be ``runuser`` or ``ip netns exec``)."""
        return int((self.data / "postmaster.pid").read_text().split()[0])

    def kill(self) -> None:
        """SIGKILL the postmaster, as a crash would, and wait until none of its processes is
        left (a restart on the same data directory needs that)."""
        os.kill(self._postmaster_pid(), signal.SIGKILL)
        assert self.proc is not None
        self.proc.wait(20)
        self.proc = None
        deadline = time.monotonic() + 30
        while _children_of_data(self.data):
            if time.monotonic() > deadline:
                raise RuntimeError("PostgreSQL's backends outlived its postmaster")
            time.sleep(0.05)

    def stop(self) -> None:
        """Fast shutdown (clients disconnected, one checkpoint), then the data is removed.
        The postmaster is signalled itself: ``runuser``, which runs it as root's stand-in,
        passes a SIGTERM on but then sleeps two seconds before it exits, whenever the server
        stopped."""
        if self.proc is not None:
            try:
                os.kill(self._postmaster_pid(), signal.SIGINT)
            except (OSError, ValueError, IndexError):  # it never got as far as its PID file
                self.proc.terminate()
            try:
                self.proc.wait(20)
            except Exception:
                self.proc.kill()
            self.proc = None
        shutil.rmtree(self.dir, ignore_errors=True)


def _children_of_data(data: Path) -> list[int]:
    """PIDs of processes still working in ``data`` (PostgreSQL's processes run with it as
    their working directory): the backends of a killed postmaster, until they notice."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if os.readlink(proc / "cwd") == str(data):
                found.append(int(proc.name))
        except OSError:
            continue
    return found
