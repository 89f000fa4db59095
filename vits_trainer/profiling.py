"""Optional per-section timing of a training step, for the benchmarks.

Off by default (`NO_TIMER` costs nothing). When on, each section synchronises the device before and
after, so the split is exact but the step is slower: use it to see where time goes, not to measure
throughput. Also two counters of what makes a GPU wait, for the benchmarks and tests: HostReads (reads
into Python, by place in this package) and DeviceReads (by operator, on any device).
"""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict

import torch
from torch.utils._python_dispatch import TorchDispatchMode


class SectionTimer:
    def __init__(self, device: torch.device):
        self.device = device
        self.seconds: dict[str, float] = defaultdict(float)

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    @contextlib.contextmanager
    def __call__(self, name: str):
        self._sync()
        start = time.perf_counter()
        try:
            yield
        finally:
            self._sync()
            self.seconds[name] += time.perf_counter() - start

    def reset(self) -> None:
        self.seconds.clear()


class _NoTimer:
    def __call__(self, name: str):
        return contextlib.nullcontext()


NO_TIMER = _NoTimer()


# Tensor methods that hand a value to Python: on a GPU each one waits for every kernel queued before it.
_READS = frozenset(
    {"item", "tolist", "numpy", "cpu", "__bool__", "__float__", "__int__", "__index__", "__array__"}
)


class HostReads(torch.overrides.TorchFunctionMode):
    """Counts the places that read tensor values into Python while active, by the innermost frame of
    this package (`counts[(method, "file.py:line")]`). Reads the GPU makes implicitly (a boolean-mask
    index, `nonzero`) are not seen: `torch.cuda.set_sync_debug_mode` lists those on a GPU."""

    def __init__(self):
        super().__init__()
        self.counts: dict[tuple[str, str], int] = defaultdict(int)
        self.active = True  # cleared to leave some calls uncounted while the mode stays on

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if self.active and name in _READS:
            self.counts[(name, _caller())] += 1
        return func(*args, **(kwargs or {}))


class DeviceReads(TorchDispatchMode):
    """Counts, by operator, what makes a GPU wait, on any device: a value read into Python
    (`_local_scalar_dense`), `nonzero`, an index or write through a boolean mask (their output sizes
    depend on the data). `seen`: their names in order; `record` is called with each."""

    WAITING = frozenset({"_local_scalar_dense", "nonzero", "masked_select"})

    def __init__(self):
        super().__init__()
        self.seen: list[str] = []

    def record(self, name: str) -> None:
        self.seen.append(name)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        masked = name.startswith("index") and any(
            getattr(t, "dtype", None) == torch.bool for a in args if isinstance(a, list | tuple) for t in a
        )
        if name in self.WAITING or masked:
            self.record(name)
        return func(*args, **(kwargs or {}))


def _caller() -> str:
    import sys
    from pathlib import Path

    package = str(Path(__file__).resolve().parent)
    frame = sys._getframe(2)
    while frame is not None:
        filename = frame.f_code.co_filename
        if filename.startswith(package):
            return f"{Path(filename).relative_to(package).as_posix()}:{frame.f_lineno}"
        frame = frame.f_back
    return "?"
