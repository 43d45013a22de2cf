"""Example client: calls a long tool through ``EpochClient`` and survives a rejection.

Run: ``python examples/epoch_client.py http://127.0.0.1:8000/mcp``. Restart the server while
the countdown runs: the pending call fails at once with ``ResumptionRejected`` (the new process
cannot resume the old one's cursor), and the next call runs on a fresh session.
"""

from __future__ import annotations

import sys

import anyio

from mcp_epoch import EpochClient, ResumptionRejected


async def main(url: str) -> None:
    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        print(f"progress {progress}/{total}: {message}")

    async with EpochClient(url) as client:
        while True:
            try:
                result = await client.call_tool(
                    "countdown",
                    {"n": 20, "delay": 0.5, "close_after": 5},
                    progress_callback=on_progress,
                )
            except ResumptionRejected as exc:
                print(f"rejected ({exc.reason}); continuing on a new session")
                continue
            print("result:", result.content[0].text)  # type: ignore[union-attr]
            return


if __name__ == "__main__":
    anyio.run(main, sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8000/mcp")
