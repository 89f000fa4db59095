"""torch's threads sized to the CPUs other processes leave free, re-measured while the run goes on.

Why: a step is many short parallel regions, and each waits for its slowest thread. When other processes
keep the cores busy, one of our threads is always waiting for a CPU, so two threads are far slower than
one; on a quiet machine two threads are the faster (figures: docs/performance.md, "Threads on a shared
CPU", from bench/bench_threads.py). Load changes over a run of hours, so the
count is not fixed at start-up: every `interval` seconds the CPU time others used on this process's
CPUs is measured (/proc/stat's busy time minus this process's own, /proc/self/stat: the run's own
DataLoader workers count among the others, as they too take CPUs from torch's threads), and the thread
count becomes the CPUs they left free, rounded, between 1 and the configured count. A change needs two
windows in a row agreeing, so one busy spell does not make the count flap. Linux only; elsewhere, or
when the user set OMP_NUM_THREADS, the count stays as configured.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable

BUSY_FIELDS = (0, 1, 2, 5, 6, 7)  # user nice system irq softirq steal (guest time is inside user)


def read_busy_ticks(cpus: set[int], path: str = "/proc/stat") -> int:
    """Busy clock ticks, since boot, summed over `cpus`."""
    total = 0
    with open(path, encoding="ascii") as f:
        for line in f:
            name, _, rest = line.partition(" ")
            if not name.startswith("cpu") or name == "cpu":
                continue
            if int(name[3:]) in cpus:
                values = rest.split()
                total += sum(int(values[i]) for i in BUSY_FIELDS if i < len(values))
    return total


def read_own_ticks(path: str = "/proc/self/stat") -> int:
    """This process's CPU time (all its threads: utime + stime) in clock ticks."""
    with open(path, encoding="ascii") as f:
        fields = f.read().rpartition(")")[2].split()  # the command name may contain spaces
    return int(fields[11]) + int(fields[12])


def set_threads(n: int) -> None:
    import torch

    torch.set_num_threads(n)
    numba = sys.modules.get("numba")  # the alignment search's parallel loop, when it is loaded
    if numba is not None:
        try:
            numba.set_num_threads(min(n, numba.config.NUMBA_NUM_THREADS))
        except Exception:  # numba's threading layer not started yet: it takes NUMBA_NUM_THREADS then
            pass


class CpuShare:
    """Call `poll()` often (after each optimiser step); it measures every `interval` seconds and returns
    a line for the log when it changed the thread count, else None."""

    def __init__(
        self,
        cpus: set[int],
        max_threads: int,
        interval: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
        busy_ticks: Callable[[], int] | None = None,
        own_ticks: Callable[[], int] = read_own_ticks,
        apply: Callable[[int], None] = set_threads,
        ticks_per_second: float | None = None,
    ):
        self.cpus = set(cpus)
        self.max_threads = max(1, max_threads)
        self.threads = self.max_threads
        self.interval = interval
        self.clock = clock
        self.busy_ticks = busy_ticks or (lambda: read_busy_ticks(self.cpus))
        self.own_ticks = own_ticks
        self.apply = apply
        self.hz = ticks_per_second or os.sysconf("SC_CLK_TCK")
        self.others: float | None = None  # CPUs other processes used in the last window
        self.changes = 0
        self._pending: int | None = None
        self._mark = self._read()

    def _read(self) -> tuple[float, int, int]:
        return self.clock(), self.busy_ticks(), self.own_ticks()

    def wanted(self, others: float) -> int:
        free = len(self.cpus) - others
        return min(self.max_threads, max(1, int(free + 0.5)))

    def poll(self) -> str | None:
        if self.clock() - self._mark[0] < self.interval:
            return None
        t0, t1 = self._measure()
        want = self.wanted(self.others)
        if want == self.threads:
            self._pending = None
            return None
        if self._pending != want:  # the first window that disagrees: wait for a second one
            self._pending = want
            return None
        return self._change(want, t1 - t0)

    def settle(self, min_window: float = 1.0) -> str | None:
        """Once, before the start evaluation: the count for the load since the governor was made, applied
        at once (no second window). That evaluation's time is the budget's estimate for later ones; at 2
        threads on busy CPUs it took 2-2.7x the final one at 1 (docs/performance.md, "Evaluation
        warm-up"). None when the window is shorter than `min_window` s or nothing changes."""
        if self.clock() - self._mark[0] < min_window:
            return None
        t0, t1 = self._measure()
        want = self.wanted(self.others)
        self._pending = None
        return None if want == self.threads else self._change(want, t1 - t0)

    def _measure(self) -> tuple[float, float]:
        """`others` over the window since the last mark, and a new mark; the window's (start, end)."""
        now = self._read()
        (t0, busy0, own0), (t1, busy1, own1) = self._mark, now
        self._mark = now
        self.others = max(0.0, ((busy1 - busy0) - (own1 - own0)) / self.hz / max(t1 - t0, 1e-9))
        return t0, t1

    def _change(self, want: int, window: float) -> str:
        old, self.threads, self._pending = self.threads, want, None
        self.apply(want)
        self.changes += 1
        return (
            f"threads: {old} -> {want} (other processes, this run's data-loading workers included, used "
            f"{self.others:.1f} of this run's {len(self.cpus)} CPUs over the last {window:.0f} s)"
        )


def cpu_share(configured_threads: int, user_pinned: bool) -> CpuShare | None:
    """The governor for this process, or None where it does not apply (not Linux, the user's own
    OMP_NUM_THREADS, a single CPU)."""
    if user_pinned or configured_threads <= 1:
        return None
    try:
        cpus = os.sched_getaffinity(0)
        share = CpuShare(cpus, configured_threads)
    except (AttributeError, OSError, ValueError):  # no /proc (not Linux) or an unreadable one
        return None
    return share
