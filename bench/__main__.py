"""`python -m bench [NAME] [options]`: one benchmark by name, or all of them.

Names: service, replica, forward, longpoll, guard, propagation, webhook, proxy. Options go to each
benchmark; ``--quick`` (which every one takes) runs them small, for a quick look.
"""

from __future__ import annotations

import importlib
import sys

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
    for name in names:
        print(f"== {name} ==", flush=True)
        module = importlib.import_module(BENCHES[name])
        status |= module.main(args)
    return status


if __name__ == "__main__":
    sys.exit(main())
