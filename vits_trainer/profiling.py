"""Optional per-section timing of a training step, for the benchmarks.

Off by default (`NO_TIMER` costs nothing). When on, each section synchronises the device before and
after, so the split is exact but the step is slower: use it to see where time goes, not to measure
throughput.
"""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict

import torch


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
