"""The one-writer rule of a SQLite ledger: an exclusive ``flock`` next to the file."""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path


class FileLock:
    """An exclusive ``flock`` on ``<ledger>.lock``; the kernel drops it if the process dies."""

    def __init__(self, fd: int, path: Path) -> None:
        self._fd = fd
        self.path = path

    @classmethod
    def take(cls, db: Path) -> FileLock:
        db.parent.mkdir(parents=True, exist_ok=True)
        path = db.with_name(db.name + ".lock")
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise RuntimeError(
                f"another epoch service process is using the ledger {db}: a SQLite ledger has "
                "one service process; use PostgreSQL (EPOCHSVC_DATABASE_URL=postgresql://...) "
                "to run several"
            ) from None
        return cls(fd, path)

    def release(self) -> None:
        with contextlib.suppress(OSError):
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
