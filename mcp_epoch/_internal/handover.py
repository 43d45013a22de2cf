"""What moves with a session when its process hands it on, as data and on the wire.

A session moves with the protocol-level state its ``initialize`` established (the client's
``initialize`` request, the path and ``Host`` it was sent to, the protocol version and log
level the client set) and a :class:`Tail` per earlier owner: the events of the session that the
owner still buffered, under that owner's own event IDs. A tail is exact by construction: it
holds *every* event of the session with a seq from ``oldest`` (the owner's oldest buffered seq
when it handed on) up to the hand-on, and the session had nothing in flight then, so nothing
after it can exist. State a tool keeps in process memory does not move.

The wire form is one JSON document per hand-on (``POST`` to the successor's
:data:`mcp_epoch.contract.HANDOFF_PATH`), checked field by field on arrival. Nothing here does I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Annotated, Final, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from mcp_epoch.contract import (
    MAX_PROCESS_EPOCH_LEN,
    PROCESS_EPOCH_PATTERN,
    ProcessEpoch,
)

#: A hand-on carries at most this many bytes (tails are bounded by the owner's buffer).
MAX_HANDOFF_BYTES: Final = 64 * 1024 * 1024
#: A session moves at most this many times before its oldest tails are dropped (each drop
#: only turns cursors of that owner into rejections, never into wrong replays).
MAX_TAILS: Final = 8

ProcessEpochText = Annotated[
    str, StringConstraints(pattern=rf"^{PROCESS_EPOCH_PATTERN}$", max_length=MAX_PROCESS_EPOCH_LEN)
]


class TailEvent(NamedTuple):
    """One buffered event: ``data`` is the JSON-RPC message as sent, ``None`` for a priming
    event (which carries an ID and nothing else)."""

    seq: int
    stream_id: str
    data: str | None


@dataclass(frozen=True, slots=True)
class Tail:
    """Every event of one session that process ``epoch`` buffered from seq ``oldest`` on
    (ascending by seq). A cursor of ``epoch`` below ``oldest`` is a gap."""

    epoch: ProcessEpoch
    oldest: int
    events: tuple[TailEvent, ...]

    def event_id(self, seq: int) -> str:
        return f"{self.epoch}:{seq}"


@dataclass(frozen=True, slots=True)
class HandedSession:
    """One session as it moves: see the module docstring."""

    public_id: str
    path: str
    host: str | None
    initialize: bytes
    protocol_version: str | None
    log_level: str | None
    tails: tuple[Tail, ...]


# --- the wire form -----------------------------------------------------------------------------


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class _WireEvent(_Strict):
    seq: int = Field(ge=1)
    stream: str = Field(min_length=1, max_length=256)
    data: str | None = None


class _WireTail(_Strict):
    epoch: ProcessEpochText
    oldest: int = Field(ge=1)
    events: list[_WireEvent]


class _WireSession(_Strict):
    id: str = Field(min_length=1, max_length=256)
    path: str = Field(pattern=r"^/", max_length=2048)
    host: str | None = Field(default=None, max_length=1024)
    initialize: str = Field(min_length=2, max_length=1024 * 1024)
    protocol_version: str | None = Field(default=None, max_length=64)
    log_level: str | None = Field(default=None, max_length=32)
    tails: list[_WireTail] = Field(max_length=MAX_TAILS)


class _WireHandoff(_Strict):
    sender: ProcessEpochText
    sessions: list[_WireSession] = Field(max_length=100_000)


class _WireAnswer(_Strict):
    adopted: list[str]
    refused: dict[str, str]


def encode(sender: ProcessEpoch, sessions: Iterable[HandedSession]) -> bytes:
    wire = _WireHandoff(
        sender=str(sender),
        sessions=[
            _WireSession(
                id=s.public_id,
                path=s.path,
                host=s.host,
                initialize=s.initialize.decode(),
                protocol_version=s.protocol_version,
                log_level=s.log_level,
                tails=[
                    _WireTail(
                        epoch=str(t.epoch),
                        oldest=t.oldest,
                        events=[_WireEvent(seq=e[0], stream=e[1], data=e[2]) for e in t.events],
                    )
                    for t in s.tails[-MAX_TAILS:]
                ],
            )
            for s in sessions
        ],
    )
    return wire.model_dump_json().encode()


def decode(body: bytes) -> tuple[ProcessEpoch, list[HandedSession]]:
    """The sender and its sessions; ``ValueError`` (with what is wrong) for anything else."""
    wire = _WireHandoff.model_validate_json(body)
    sessions = []
    for s in wire.sessions:
        tails = []
        for t in s.tails:
            seqs = [e.seq for e in t.events]
            if seqs != sorted(set(seqs)) or (seqs and seqs[0] < t.oldest):
                raise ValueError(f"tail of {t.epoch} in session {s.id}: seqs out of order")
            events = tuple(TailEvent(e.seq, e.stream, e.data) for e in t.events)
            tails.append(Tail(ProcessEpoch.parse(t.epoch), t.oldest, events))
        sessions.append(
            HandedSession(
                s.id,
                s.path,
                s.host,
                s.initialize.encode(),
                s.protocol_version,
                s.log_level,
                tuple(tails),
            )
        )
    return ProcessEpoch.parse(wire.sender), sessions


def encode_answer(adopted: Sequence[str], refused: dict[str, str]) -> bytes:
    return _WireAnswer(adopted=list(adopted), refused=refused).model_dump_json().encode()


def decode_answer(body: bytes) -> tuple[list[str], dict[str, str]]:
    answer = _WireAnswer.model_validate_json(body)
    return answer.adopted, answer.refused
