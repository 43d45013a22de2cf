"""What a POST body asks for, read once.

Several parts look into the same JSON-RPC body: the guard (which calls start, which are
cancelled, whether one starts work, a ``logging/setLevel``), the sidecar's relay (the calls it
must answer if the upstream does not, the revision an ``initialize`` asks for) and every error
answer (the id to echo). Parsing it once per look cost a fifth of the sidecar's own time on a
short request, so it is parsed once here and the last body's reading is kept: a body equal to
it reads the same, whoever asks, so sharing it is correct without any request context.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, NamedTuple

from pydantic_core import from_json

#: Requests a draining process refuses on its own sessions: those that start work of
#: unbounded length. Everything else is answered at once, and clients need it to finish the
#: calls they have (the SDK client lists tools to check a call's result, pings a session).
WORK_METHODS: Final = frozenset({"tools/call"})


class PostBody(NamedTuple):
    """One POST body's JSON-RPC content; all empty for a body that is not JSON-RPC (the
    server behind answers it, and there is no call to wait for). A named tuple: read for
    every POST, and built in one step where a frozen dataclass set each field in turn."""

    body: bytes
    #: Its requests: each id as the SDK names the request's stream (``str(id)``), to the id as
    #: sent. Read-only: one reading is shared by every request with an equal body.
    calls: Mapping[str, str | int]
    #: The ids named by ``notifications/cancelled``, as stream names.
    cancelled: tuple[str, ...] = ()
    #: Whether a request starts work (see :data:`WORK_METHODS`).
    work: bool = False
    #: The level of a ``logging/setLevel`` request (it moves with a session).
    log_level: str | None = None
    #: The id of the one request of a body that is a single message, as sent (for an error
    #: answer to echo).
    single_id: str | int | None = None
    #: The revision an ``initialize`` asks for.
    asked_version: str | None = None


_last: PostBody | None = None
_CANCELLED: Final = "notifications/cancelled"
_SET_LEVEL: Final = "logging/setLevel"
_INITIALIZE: Final = "initialize"
#: The methods whose params :func:`read_post` reads; every other single message is read from
#: its ``method`` and ``id`` alone.
_READS_PARAMS: Final = frozenset({_CANCELLED, _SET_LEVEL, _INITIALIZE})


def read_post(body: bytes) -> PostBody:
    """``body``'s JSON-RPC content (see :class:`PostBody`)."""
    global _last
    last = _last
    if last is not None and (last.body is body or last.body == body):
        return last
    _last = read = _read(body)
    return read


def _id(value: Any) -> str | int | None:
    # The parser gives exact types: ``type`` is enough, and it leaves out ``bool``.
    return value if type(value) is int or type(value) is str else None


def _read(body: bytes) -> PostBody:
    # pydantic's parser (the SDK parses the body with it too): a third of the time of the
    # standard library's, and its depth limit makes a hostile, deeply nested body a
    # ValueError, where ``json.loads`` raised RecursionError out of the request.
    try:
        parsed: Any = from_json(body)
    except ValueError:
        return PostBody(body, {})
    if type(parsed) is dict:
        method = parsed.get("method")
        if type(method) is str and method not in _READS_PARAMS:
            # One message whose params say nothing here (a call, a notification): what
            # the loop below reads of it, in the fewest steps (every tool call is one).
            rid = _id(parsed.get("id"))
            if rid is None:
                return tuple.__new__(PostBody, (body, {}, (), False, None, None, None))
            work = method in WORK_METHODS
            return tuple.__new__(PostBody, (body, {str(rid): rid}, (), work, None, rid, None))
    calls: dict[str, str | int] = {}
    cancelled: list[str] = []
    work = False
    level = asked = None
    for item in parsed if isinstance(parsed, list) else [parsed]:
        method = item.get("method") if isinstance(item, dict) else None
        if not isinstance(method, str):
            continue
        params = item.get("params")
        rid = _id(item.get("id"))
        if rid is not None:
            calls[str(rid)] = rid
            work = work or method in WORK_METHODS
        elif method == _CANCELLED and isinstance(params, dict):
            named = _id(params.get("requestId"))
            if named is not None:
                cancelled.append(str(named))
        if not isinstance(params, dict):
            continue
        if method == _SET_LEVEL:
            value = params.get("level")
            level = value if isinstance(value, str) and len(value) <= 32 else level
        elif method == _INITIALIZE and isinstance(params.get("protocolVersion"), str):
            asked = params["protocolVersion"]
    single = None
    if isinstance(parsed, dict) and "method" in parsed:
        single = _id(parsed.get("id"))
    # Built as ``_make`` builds a named tuple, without its Python ``__new__`` (read per POST).
    return tuple.__new__(PostBody, (body, calls, tuple(cancelled), work, level, single, asked))
