"""Session IDs that name their owner: ``<process epoch>_<SDK session id>``.

The SDK mints a session ID per ``initialize`` (32 random hex digits). The guard shows clients
that ID prefixed with this process's epoch, so any replica can tell from a request alone which
process owns its session, and strips the prefix again before the SDK sees the request. The
random part stays what makes the ID unguessable; the prefix only routes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from mcp_epoch.contract import MAX_PROCESS_EPOCH_LEN, SESSION_SEPARATOR, ProcessEpoch

# The SDK's IDs are uuid4().hex; accept any visible-ASCII token of sane length after the prefix.
_LOCAL_RE = re.compile(r"\A[0-9A-Za-z-]{1,128}\Z")
MAX_SESSION_ID_LEN = MAX_PROCESS_EPOCH_LEN + 1 + 128


@dataclass(frozen=True, slots=True)
class SessionId:
    """A session ID as clients see it: its owner's process epoch and the owner's local ID."""

    owner: ProcessEpoch
    local: str

    def encode(self) -> str:
        return f"{self.owner}{SESSION_SEPARATOR}{self.local}"

    @classmethod
    def decode(cls, raw: str) -> SessionId:
        """Parse an ``Mcp-Session-Id``; ``ValueError`` for one not minted through a guard."""
        if len(raw) > MAX_SESSION_ID_LEN:
            raise ValueError(f"session ID is {len(raw)} characters long")
        epoch, sep, local = raw.partition(SESSION_SEPARATOR)
        if not sep or _LOCAL_RE.match(local) is None:
            raise ValueError("session ID does not name its owning process")
        return cls(ProcessEpoch.parse(epoch), local)
