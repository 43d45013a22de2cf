"""The forwarder's hop against owners that misbehave at exact moments, on loopback.

A draining owner closes its idle connections when it stops accepting, and a peer that reuses
a pooled connection at that very moment loses its request unanswered: it cannot tell that
from a crash, so the client gets a 502 for a request that never ran. Hitting that moment with
real processes is a matter of luck, so the owner here is a small loopback server that always
closes an already-used connection when the next request arrives on it. Then: a fresh
connection closed under its request, unread (what a draining owner does, see
``test_serve_stop_accepting``) and after reading it (an owner that died running it); and
scripted owners whose answers arrive in pieces, break off, or never end while the client
leaves, which the hop (``mcp_epoch._internal.upstream``) must frame and classify exactly.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import select
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx
import pytest

from mcp_epoch._internal.body import MAX_BODY_BYTES
from mcp_epoch._internal.forward import Forwarder, OwnerLost, OwnerUnreachable, Route
from mcp_epoch._internal.snapshot import EpochRecord, EpochSnapshot
from mcp_epoch._internal.store import EpochEventStore
from mcp_epoch.contract import FORWARDED_BY_HEADER, FORWARDED_TO_HEADER, PodEpoch, ProcessEpoch
from tests.replica.inprocess import EPOCH, Session, running

pytestmark = pytest.mark.anyio


OWNER = ProcessEpoch.parse("0123abcd-7.0")


class ClosesReusedConnections:
    """Answers the first request of every connection, closes on any later one."""

    def __init__(self) -> None:
        self.answered = 0
        self.closed_under_a_request = 0
        self.server: asyncio.Server | None = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        first = True
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
                await _read_body(reader, head)
            except (asyncio.IncompleteReadError, ConnectionError):
                break
            if not first:
                self.closed_under_a_request += 1
                writer.transport.abort()
                return
            first = False
            self.answered += 1
            body = b'{"jsonrpc":"2.0","id":1,"result":{}}'
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                b"content-length: %d\r\n\r\n%s" % (len(body), body)
            )
            await writer.drain()
        writer.close()


async def _read_body(reader: asyncio.StreamReader, head: bytes) -> None:
    """Consume a request body (the forwarder sends its length)."""
    for line in head.lower().split(b"\r\n"):
        if line.startswith(b"content-length:"):
            await reader.readexactly(int(line.split(b":", 1)[1]))


PING = b'{"jsonrpc":"2.0","id":1,"method":"ping"}'


@dataclass
class Relayed:
    """What the forwarder sent its client."""

    messages: list[dict[str, Any]] = field(default_factory=list)

    @property
    def status(self) -> int:
        return int(next(m["status"] for m in self.messages if m["type"] == "http.response.start"))

    @property
    def headers(self) -> dict[bytes, bytes]:
        start = next(m for m in self.messages if m["type"] == "http.response.start")
        return dict(start["headers"])

    @property
    def body(self) -> bytes:
        return b"".join(
            m.get("body", b"") for m in self.messages if m["type"] != "http.response.start"
        )

    @property
    def complete(self) -> bool:
        """The relay ended the response (a cut one never sends its last chunk)."""
        last = self.messages[-1]
        return last["type"] == "http.response.body" and not last.get("more_body", False)


async def _forward_one(
    forwarder: Forwarder,
    route: Route,
    *,
    body: bytes = PING,
    headers: Sequence[tuple[bytes, bytes]] = ((b"host", b"x"),),
    on_send: Callable[[Relayed], None] = lambda _: None,
    leaves: asyncio.Event | None = None,
) -> Relayed:
    scope: dict[str, Any] = {
        "type": "http",
        "method": "POST",
        "path": "/mcp",
        "raw_path": b"/mcp",
        "query_string": b"",
        "headers": [
            *headers,
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
        ],
    }
    out = Relayed()

    async def receive() -> dict[str, Any]:  # the body was read: only the client's leaving
        await (leaves or asyncio.Event()).wait()  # the client stays until told otherwise
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        out.messages.append(dict(message))
        on_send(out)

    await forwarder.forward(scope, body, receive, send, route)
    return out


async def test_every_forward_has_a_connection_of_its_own() -> None:
    owner = ClosesReusedConnections()
    server = await asyncio.start_server(owner._serve, "127.0.0.1", 0)
    route = Route(OWNER, f"127.0.0.1:{server.sockets[0].getsockname()[1]}")
    forwarder = Forwarder()
    try:
        for _ in range(3):
            out = await _forward_one(forwarder, route)
            assert out.status == 200 and b'"result"' in out.body
    finally:
        server.close()
    assert owner.answered == 3 and owner.closed_under_a_request == 0


class ClosesUnder:
    """A one-connection owner on a plain socket that closes once the request is in: with it
    unread (the kernel resets the connection) or after reading all of it (a clean close)."""

    def __init__(self, *, read_first: bool) -> None:
        self.read_first = read_first
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.route = Route(OWNER, f"127.0.0.1:{self.listener.getsockname()[1]}")

    def run(self) -> None:
        conn, _ = self.listener.accept()
        with conn:
            if self.read_first:
                request = b""
                while not _whole(request):
                    request += conn.recv(65536)
            else:
                select.select([conn], [], [])  # the request has arrived; leave it unread
        self.listener.close()


def _whole(request: bytes) -> bool:
    """The request has arrived with all of its body (the forwarder sends Content-Length)."""
    head, sep, body = request.partition(b"\r\n\r\n")
    if not sep:
        return False
    for line in head.lower().split(b"\r\n"):
        if line.startswith(b"content-length:"):
            return len(body) >= int(line.split(b":", 1)[1])
    raise AssertionError(f"a forwarded request without Content-Length: {head!r}")


async def _forward_to(owner: ClosesUnder) -> BaseException:
    async with anyio.create_task_group() as tg:
        tg.start_soon(anyio.to_thread.run_sync, owner.run)
        with pytest.raises((OwnerUnreachable, OwnerLost)) as raised:
            await _forward_one(Forwarder(), owner.route)
    return raised.value


async def test_an_owner_that_resets_the_request_unread_did_not_take_it() -> None:
    """What a draining owner does to a request arriving as it stops accepting: the forwarder
    may then reject (the client re-initializes elsewhere) instead of answering 502."""
    error = await _forward_to(ClosesUnder(read_first=False))
    assert isinstance(error, OwnerUnreachable), error
    assert "reset the connection unread" in str(error)


async def test_an_owner_that_read_the_request_and_went_away_may_have_run_it() -> None:
    error = await _forward_to(ClosesUnder(read_first=True))
    assert isinstance(error, OwnerLost), error
    assert "closed the connection before answering" in str(error)  # the client is told why


class Scripted:
    """An owner that reads one request whole, keeps it, and writes ``head`` then each of
    ``rest`` once the client has been sent something more (so the answer really arrives in
    pieces), then closes."""

    def __init__(self, head: bytes, *rest: bytes, hold_open: bool = False) -> None:
        self.pieces = [head, *rest]
        self.hold_open = hold_open  # never end the answer: wait for the forwarder to close
        self.closed_by_forwarder = asyncio.Event()
        self.requests: list[bytes] = []
        self.relayed = asyncio.Event()
        self.address = ""

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(
            int(line.split(b":", 1)[1])
            for line in head.lower().split(b"\r\n")
            if line.startswith(b"content-length:")
        )
        self.requests.append(head + await reader.readexactly(length))
        for i, piece in enumerate(self.pieces):
            if i > 1:
                await self.relayed.wait()
                self.relayed.clear()
            writer.write(piece)
            await writer.drain()
        if self.hold_open:
            with contextlib.suppress(ConnectionError):
                await reader.read()
            self.closed_by_forwarder.set()
        writer.close()

    def seen(self, out: Relayed) -> None:
        self.relayed.set()

    async def forward(self, **options: Any) -> Relayed:
        server = await asyncio.start_server(self.serve, "127.0.0.1", 0)
        self.address = f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
        try:
            options.setdefault("on_send", self.seen)
            return await _forward_one(Forwarder(), Route(OWNER, self.address), **options)
        finally:
            server.close()


SSE_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
)


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


async def test_a_streamed_answer_is_relayed_in_order_and_ended() -> None:
    owner = Scripted(
        SSE_HEAD + _chunk(b"id: e:1\ndata: one\n\n"),
        _chunk(b"id: e:2\ndata: two\n\n"),
        _chunk(b"id: e:3\ndata: three\n\n") + b"0\r\n\r\n",
    )
    out = await owner.forward()
    assert out.status == 200 and out.complete
    assert out.body == b"id: e:1\ndata: one\n\nid: e:2\ndata: two\n\nid: e:3\ndata: three\n\n"
    assert out.headers[b"content-type"] == b"text/event-stream"
    assert b"transfer-encoding" not in out.headers  # hop-by-hop: the ASGI server redoes it
    assert out.headers[FORWARDED_BY_HEADER.encode()] == str(OWNER).encode()
    # What the owner got: the body with its length, one request per connection, its epoch named.
    head, _, body = owner.requests[0].partition(b"\r\n\r\n")
    lines = head.lower().split(b"\r\n")
    assert lines[0] == b"post /mcp http/1.1" and body == PING
    lengths = [x for x in lines if x.startswith(b"content-length:")]
    assert lengths == [b"content-length: %d" % len(PING)]  # the client's, set anew
    assert b"connection: close" in lines
    assert f"{FORWARDED_TO_HEADER}: {OWNER}".lower().encode() in lines


@pytest.mark.parametrize(
    ("head", "rest", "relayed"),
    [
        (SSE_HEAD + _chunk(b"id: e:1\ndata: one\n\n"), b"5\r\nid: ", b"id: e:1\ndata: one\n\n"),
        (b"HTTP/1.1 200 OK\r\ncontent-length: 40\r\n\r\n", b'{"jsonrpc":', b'{"jsonrpc":'),
    ],
    ids=["stream", "json"],
)
async def test_an_owner_that_breaks_off_mid_answer_cuts_the_clients_stream(
    head: bytes, rest: bytes, relayed: bytes
) -> None:
    """No last chunk: the client sees a dropped stream and resumes from its last event."""
    out = await Scripted(head, rest).forward()
    assert out.status == 200 and not out.complete
    assert out.body.startswith(relayed)


async def test_a_request_without_host_names_the_owners_address() -> None:
    """An HTTP/1.0 client may send no Host; HTTP/1.1 to the owner needs one."""
    answer = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}"
    owner = Scripted(b"HTTP/1.1 100 Continue\r\n\r\n", answer)
    out = await owner.forward(headers=())
    assert out.status == 200 and out.body == b"{}" and out.complete  # the 100 is skipped
    assert f"host: {owner.address}".encode() in owner.requests[0].lower().split(b"\r\n")


class OwnerAt(EpochEventStore):
    """A ledger in which process :data:`OWNER` is live at :attr:`address` (set per test)."""

    address = "127.0.0.1:1"

    def snapshot(self) -> EpochSnapshot:
        pod = OWNER.pod
        owner = EpochRecord(str(pod), "live", OWNER.incarnation, self.address)
        return EpochSnapshot.of(f"{pod.ledger8}-ledger", 7, [owner])


def test_a_body_over_the_bound_gets_413_and_reaches_no_one() -> None:
    """Refused before anything runs: not by the SDK here, and not by the owner of the session
    it names (nothing connects to it)."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setblocking(False)
    owner_at = type("OwnerHere", (OwnerAt,), {"address": f"127.0.0.1:{listener.getsockname()[1]}"})
    oversized = b" " * (MAX_BODY_BYTES + 1)
    with listener, running(store_cls=owner_at) as server:
        session = Session(server.url)
        sessions = (session.sid, f"{OWNER}_{session.sid.split('_', 1)[1]}")
        with httpx.Client(timeout=10) as http:
            for sid in ("", *sessions):
                headers = session.headers(**({"mcp-session-id": sid} if sid else {}))
                if not sid:
                    del headers["mcp-session-id"]
                r = http.post(server.url, content=oversized, headers=headers)
                assert r.status_code == 413, (sid, r.status_code, r.text)
                assert r.json()["error"]["message"] == f"request body over {MAX_BODY_BYTES} bytes"
        with pytest.raises(BlockingIOError):
            listener.accept()  # nothing ever connected to the owner
        # The session is unharmed: a normal request in it is still served.
        r = session.http.post(
            server.url, json=session.body("ping", {}, 9), headers=session.headers()
        )
        assert r.status_code == 200, r.text


async def test_an_owner_not_listening_did_not_take_the_request() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    route = Route(OWNER, f"127.0.0.1:{listener.getsockname()[1]}")
    listener.close()
    with pytest.raises(OwnerUnreachable, match="no connection"):
        await _forward_one(Forwarder(), route)


async def test_a_client_that_leaves_mid_stream_ends_the_owners_side(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The owner's handler is cancelled as for a direct client that left (its connection
    closes); the relay ends without logging a broken stream."""
    owner = Scripted(SSE_HEAD + _chunk(b"id: e:1\ndata: one\n\n"), hold_open=True)
    leaves = asyncio.Event()
    with caplog.at_level(logging.INFO, logger="mcp_epoch"):
        out = await owner.forward(leaves=leaves, on_send=lambda out: leaves.set())
    assert out.body == b"id: e:1\ndata: one\n\n" and not out.complete
    await asyncio.wait_for(owner.closed_by_forwarder.wait(), 10)
    assert "broke" not in caplog.text  # the owner did not go away: the client did


class DrainingWithAPeerThatIsGone(EpochEventStore):
    """The ledger as a draining process sees it when its one live peer has just died: the
    peer is still ``live`` at an address where nothing listens any more."""

    def __init__(self, epoch: ProcessEpoch, **options: Any) -> None:
        super().__init__(epoch, **options)
        listener = socket.create_server(("127.0.0.1", 0))
        gone = f"127.0.0.1:{listener.getsockname()[1]}"
        listener.close()
        own, peer = epoch.pod, PodEpoch(epoch.pod.ledger8, epoch.pod.generation + 1)
        self._view = EpochSnapshot.of(
            f"{own.ledger8}-ledger",
            7,
            [
                EpochRecord(str(own), "draining", epoch.incarnation, "127.0.0.1:1"),
                EpochRecord(str(peer), "live", 0, gone),
            ],
        )

    def snapshot(self) -> EpochSnapshot:
        return self._view


def test_a_new_session_a_draining_process_cannot_hand_on_is_served_there() -> None:
    """The peer does not take the ``initialize``, so the draining process serves it itself,
    body and all (it is still up and answers until it exits)."""
    with running(store_cls=DrainingWithAPeerThatIsGone) as server:
        session = Session(server.url)  # initialize: 200 and a session, within the timeout
        assert session.sid.startswith(f"{EPOCH}_")


async def test_an_answer_of_no_declared_length_ends_with_the_owners_close() -> None:
    out = await Scripted(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n\r\nhel", b"lo").forward()
    assert out.status == 200 and out.body == b"hello" and out.complete


async def test_a_malformed_answer_is_an_owner_that_may_have_run_the_request() -> None:
    with pytest.raises(OwnerLost, match="malformed"):
        await Scripted(b"HTTP/1.1 two hundred\r\n\r\n").forward()
