"""`python -m bench [NAME] [options]`: one benchmark by name, or all of them.

Names: service, replica, forward, longpoll, guard, propagation, webhook, proxy. Options go to each
benchmark; ``--quick`` (which every one takes) runs them small, for a quick look. At the end,
every ratio to a floor the benchmarks judged (their ``ratio:`` lines), and the time it took
(and each benchmark's, in a run of several).
"""

from __future__ import annotations

import contextlib
import importlib
import io
import sys
import time
from typing import TextIO


class _Gather(io.TextIOBase):
    """Writes through to ``out`` and keeps the ``ratio:`` lines."""

    def __init__(self, out: TextIO) -> None:
        self.out, self.ratios, self._line = out, [], ""

    def write(self, text: str) -> int:
        self.out.write(text)
        self._line += text
        *done, self._line = self._line.split("\n")
        self.ratios += [line for line in done if line.startswith("ratio:")]
        return len(text)

    def flush(self) -> None:
        self.out.flush()


BENCHES = {
    "service": "bench.service_bench",
    "replica": "bench.replica_bench",
    "forward": "bench.forward_bench",
    "longpoll": "bench.longpoll_bench",
    "guard": "bench.guard_bench",
    "propagation": "bench.propagation_bench",
    "webhook": "bench.webhook_bench",
    "proxy": "bench.proxy_bench",
}


def main() -> int:
    args = sys.argv[1:]
    if args and args[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    names = [args.pop(0)] if args and args[0] in BENCHES else list(BENCHES)
    status = 0
    began = time.monotonic()
    gather = _Gather(sys.stdout)
    with contextlib.redirect_stdout(gather):
        for name in names:
            print(f"== {name} ==", flush=True)
            started = time.monotonic()
            module = importlib.import_module(BENCHES[name])
            status |= module.main(args)
            if len(names) > 1:  # where a whole run's time went
                print(f"({name}: {time.monotonic() - started:.0f} s)", flush=True)
    if len(names) > 1:
        print("== ratios to their floors ==")
        print("\n".join(gather.ratios) or "(none judged)")
    print(
        f"({len(names)} benchmark{'s' if len(names) > 1 else ''} in "
        f"{time.monotonic() - began:.0f} s)"
    )
    return status


if __name__ == "__main__":
    sys.exit(main())
