"""``python -m tests.robustness.relay SOCKET HOST:PORT``: a Unix socket in front of a TCP port.

Run inside a network namespace (``ip netns exec``), it lets the test process, outside it,
reach a service that listens only there, without touching the host's own network settings:
the file system, and so the socket, is shared by every network namespace.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError):
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    writer.close()


async def main(path: str, target: str) -> None:
    host, port = target.rsplit(":", 1)

    async def serve(down_r: asyncio.StreamReader, down_w: asyncio.StreamWriter) -> None:
        try:
            up_r, up_w = await asyncio.open_connection(host, int(port))
        except OSError:
            down_w.close()
            return
        await asyncio.gather(_pipe(down_r, up_w), _pipe(up_r, down_w))

    server = await asyncio.start_unix_server(serve, path)
    print("relaying", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
