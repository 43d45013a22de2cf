"""Request heads are bounded before they are buffered: 431 at once, and memory stays flat."""

from __future__ import annotations

import contextlib
import socket
from pathlib import Path

from tests.support.epochsvc_proc import EpochServiceProcess


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def send_head(port: int, head: bytes, size: int | None = None) -> bytes:
    """Send ``head`` (in writes of ``size`` bytes, or in one) and read the answer whole."""
    step = size or len(head)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        # The server may answer and close while we are still sending.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            for i in range(0, len(head), step):
                sock.sendall(head[i : i + step])
        chunks = []
        with contextlib.suppress(ConnectionResetError):
            while data := sock.recv(65536):
                chunks.append(data)
    return b"".join(chunks)


def test_a_one_megabyte_header_gets_431_and_nothing_else(
    epoch_service: EpochServiceProcess,
) -> None:
    head = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (1 << 20) + b"\r\n\r\n"
    answer = send_head(epoch_service.port, head)
    assert answer.startswith(b"HTTP/1.1 431 ")
    assert b'"code": "headers-too-large"' in answer
    # An ordinary request still works.
    ok = send_head(
        epoch_service.port, b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    assert ok.startswith(b"HTTP/1.1 200 ")


def test_unterminated_huge_headers_do_not_grow_the_service(
    epoch_service: EpochServiceProcess,
) -> None:
    assert epoch_service.proc is not None
    pid = epoch_service.proc.pid
    before = rss_kib(pid)
    chunk = b"b" * (1 << 20)
    socks = []
    for _ in range(8):  # 8 heads of 32 MB that never end, without credentials
        sock = socket.create_connection(("127.0.0.1", epoch_service.port), timeout=10)
        sock.sendall(b"GET /v1/epochs/x HTTP/1.1\r\nHost: x\r\nX-Big: ")
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # refused and closed
            for _ in range(32):
                sock.sendall(chunk)
        socks.append(sock)
    grown = rss_kib(pid) - before
    for sock in socks:
        sock.close()
    assert grown < 32 * 1024, f"the service grew by {grown} KiB"


LIMIT = 16 * 1024  # EPOCHSVC_MAX_HEADER_BYTES's default, which the fixture keeps
FIXED = b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\nX-Big: "


def head_of(counted: int) -> bytes:
    """A complete head whose counted size (target, and each field with ': ' and CRLF) is
    exactly ``counted`` bytes."""
    base = len(b"/healthz") + len(b"Host") + 1 + 4 + len(b"Connection") + 5 + 4
    base += len(b"X-Big") + 4
    return FIXED + b"a" * (counted - base) + b"\r\n\r\n"


def test_the_limit_holds_for_complete_heads_in_one_write_or_in_many(
    epoch_service: EpochServiceProcess,
) -> None:
    """The documented limit is the real one: a complete head one byte over it is refused
    however it arrives (in one write, the first read of a connection, was once let through),
    and one exactly at it is served."""
    port = epoch_service.port
    for size in (LIMIT + 1, 17 * 1024, 32 * 1024, 190 * 1024):
        for write in (len(head_of(size)), 8 * 1024, 1000):
            answer = send_head(port, head_of(size), write)
            assert answer.startswith(b"HTTP/1.1 431 "), (size, write, answer[:80])
    for write in (len(head_of(LIMIT)), 8 * 1024):
        answer = send_head(port, head_of(LIMIT), write)
        assert answer.startswith(b"HTTP/1.1 200 "), (write, answer[:80])


def test_a_second_request_on_the_connection_is_bounded_too(
    epoch_service: EpochServiceProcess,
) -> None:
    """The count starts afresh for each request of a keep-alive connection, whichever read
    carries its first byte."""
    ok = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
    answer = send_head(epoch_service.port, ok + head_of(LIMIT + 1), 1 << 20)
    assert answer.startswith(b"HTTP/1.1 200 ")
    assert b"HTTP/1.1 431 " in answer
    answer = send_head(epoch_service.port, ok + head_of(LIMIT), 1 << 20)
    assert answer.count(b"HTTP/1.1 200 ") == 2
