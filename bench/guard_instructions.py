"""What mcp-epoch costs an SDK server, counted in instructions rather than timed.

    python -m bench guard --instructions [--phase-seconds 15] [--clients 8] [--steps 10]

``python -m bench guard`` judges throughput, and time on a shared two-core VM moves by more
than the gap it judges: the rounds of one run spread over ten points or more, so a change worth
one point cannot be seen in it. Instructions do not move with the machine. This runs the same
``bench.guard_server`` process under valgrind's callgrind, counting only while one variant is
loaded, and reports instructions per call for each variant and mcp-epoch's over the no-op
store's. The phases go no-op, mcp-epoch, none, mcp-epoch, no-op: each variant's phases bracket
the others', so a process whose cost per call drifts over the run moves them alike. A phase
counts the calls its load completed; the load generator waits for every call it began, so
none is cut at a phase's end.

Instructions are not time: cache misses, the collector's walks over memory and the
machine's own state cost time that a count does not see, so mcp-epoch's share of the time
has measured above its share of the instructions. The count is printed beside the judged
ratio, not as one: it says, to a fraction of a percent and within minutes, how much of the
per-call cost a change removed, where the time ratio cannot tell.
"""

from __future__ import annotations

import functools
import statistics
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

from bench.loadgen import Load

#: Counting starts off: the server's start-up and warm-up are not counted.
CALLGRIND = ("valgrind", "--tool=callgrind", "--instr-atstart=no")
PHASES = ("noop", "epoch", "none", "epoch", "noop")


class Counted:
    """A process running under callgrind, counting only inside :meth:`count`."""

    def __init__(self, pid: int, out: Path) -> None:
        self.pid, self.out = pid, out

    @staticmethod
    def command(out: Path) -> list[str]:
        """The prefix that runs a program under callgrind, its dumps in ``out``."""
        return [*CALLGRIND, f"--callgrind-out-file={out}/callgrind.%p"]

    def _control(self, *args: str) -> None:
        subprocess.run(["callgrind_control", *args, str(self.pid)], check=True, capture_output=True)

    def count(self, load: Callable[[], Load]) -> tuple[int, Load]:
        """The instructions the process ran while ``load()`` ran, and what it did."""
        before = set(self.out.iterdir())
        self._control("--instr=on")
        self._control("--zero")
        done = load()
        self._control("--dump")  # returns once the dump is written
        self._control("--instr=off")
        (dump,) = set(self.out.iterdir()) - before
        instructions = _instructions(dump)
        dump.unlink()  # megabytes each, and read once
        return instructions, done


def _instructions(dump: Path) -> int:
    """A callgrind dump's total of its one event (instructions)."""
    with dump.open(errors="replace") as f:
        for line in f:
            if line.startswith("summary:"):
                return int(line.split()[1])
    raise RuntimeError(f"{dump} has no summary line: not a callgrind dump")


def measure(
    start: Callable[[list[str]], int], load: Callable[[str, float], Load], seconds: float
) -> dict[str, list[float]]:
    """Instructions per call of each variant, one figure per phase. ``start(prefix)`` starts
    the server process under ``prefix`` and returns its pid once it serves (warmed up);
    ``load(variant, seconds)`` loads one variant."""
    out = Path(tempfile.mkdtemp(prefix="bench-guard-instructions-"))
    counted = Counted(start(Counted.command(out)), out)
    per_call: dict[str, list[float]] = {v: [] for v in dict.fromkeys(PHASES)}
    for variant in PHASES:
        instructions, done = counted.count(functools.partial(load, variant, seconds))
        if done.errors or not done.requests:
            raise RuntimeError(f"{variant}: {done.errors} errors ({done.first_error})")
        figure = instructions / done.requests
        per_call[variant].append(figure)
        print(f"  {variant:5} {done.requests:5} calls  {figure / 1e6:.3f} M", flush=True)
    return per_call


def report(per_call: dict[str, list[float]]) -> None:
    print("instructions per call (callgrind; the same load, one variant at a time):")
    names = (("no event store", "none"), ("no-op event store", "noop"), ("mcp-epoch", "epoch"))
    median = {v: statistics.median(figures) for v, figures in per_call.items()}
    for name, variant in names:
        print(f"  {name:18} {median[variant] / 1e6:8.3f} M")
    noop, added = median["noop"], median["epoch"] - median["noop"]
    print(
        f"instructions: mcp-epoch {added / 1e3:+.0f} k per call over the no-op store "
        f"({added / noop:+.1%}; not judged, see bench/guard_instructions.py)"
    )
