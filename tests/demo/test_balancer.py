"""The scenario's balancer over real loopback sockets: what a drop cuts, and that it says so."""

from __future__ import annotations

import asyncio

from epochsvc.demo.balancer import CLIENT_HEADER, Backend, Balancer


def test_a_drop_cuts_the_request_in_flight_and_says_how_many_connections_it_cut() -> None:
    async def main() -> None:
        got_request = asyncio.Event()
        release = asyncio.Event()

        async def replica(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readuntil(b"\r\n\r\n")
            got_request.set()
            await release.wait()  # never answers before the drop
            writer.close()

        backend = await asyncio.start_server(replica, "127.0.0.1", 0)
        lb = Balancer()
        await lb.start()
        lb.add(Backend("r1", "127.0.0.1", backend.sockets[0].getsockname()[1]))
        reader, writer = await asyncio.open_connection("127.0.0.1", lb.port)
        try:
            assert lb.drop("c1") == 0  # nothing of c1 yet
            writer.write(
                f"POST /mcp HTTP/1.1\r\nhost: x\r\n{CLIENT_HEADER}: c1\r\n"
                "content-length: 2\r\n\r\n{}".encode()
            )
            await writer.drain()
            await got_request.wait()
            assert lb.drop("c2") == 0 and lb.drop("c1") == 1
            try:
                cut = await reader.read()
            except ConnectionResetError:
                cut = b""
            assert cut == b""  # cut: no response at all
        finally:
            release.set()
            writer.close()
            await lb.stop()
            backend.close()

    asyncio.run(main())
