"""The real SDK server on loopback, in the windows where its own live delivery loses a stream.

The server runs in a thread of this process so that the test can hold its tool at a gate; the
interleavings come from what the client holds open, never from timing.

* **Stale registration** (the hung call): a client's SSE connection dies while the server has
  not yet noticed, and the client resumes on a new one. The SDK still holds the old stream for
  that request id, so it does not register the resumed one for live delivery: a store that
  only replays ends the resumed stream at once and the rest of the call reaches nobody.
* **Eviction overtaking a resumed stream**: the connection is aborted, never ended cleanly,
  and the next resumption from the same cursor is told ``gap``.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.replica.inprocess import Server, Session, running, texts


@pytest.fixture
def server() -> Iterator[Server]:
    with running(capacity=64) as srv:
        yield srv


def test_resume_while_the_old_connection_is_still_held_gets_the_whole_rest(
    server: Server,
) -> None:
    s = Session(server.url)
    gate = server.gates["a"]
    gate.allow(1)
    post = s.call("a", 3, rid=5)
    first = post.read(1)
    assert texts(first) == ["a 1"]
    # The old connection stays open, unread: to the server it is the live stream of id 5.
    resumed = s.resume(first[-1].id or "")
    assert resumed.status_code == 200
    gate.allow(4)  # the rest of the call, after the resumption was admitted
    rest = resumed.read(3)
    assert texts(rest) == ["a 2", "a 3", "a done"]
    resumed.close()
    post.close()


def test_a_resumed_stream_overtaken_by_eviction_is_aborted_then_told_gap() -> None:
    with running(capacity=6) as server:
        a, b = Session(server.url), Session(server.url)
        server.gates["a"].allow(1)
        post = a.call("a", 3, rid=1)
        cursor = post.read(1)[-1].id or ""
        post.close()
        resumed = a.resume(cursor)
        assert resumed.status_code == 200
        # Another session fills the ring past the cursor while "a" is quiet.
        server.gates["b"].allow(20)
        other = b.call("b", 19, rid=1)
        assert texts(other.read(20))[-1] == "b done"
        server.gates["a"].allow(4)  # "a" goes on: its follower finds its position evicted
        with pytest.raises(httpx.RemoteProtocolError):
            resumed.read(3)
        again = a.resume(cursor)
        again.response.read()
        assert again.status_code == 404
        assert again.headers["mcp-resumption-rejected"] == "gap"
