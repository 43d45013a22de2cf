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


def send_head(port: int, head: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        # The server may answer and close while we are still sending.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(head)
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
