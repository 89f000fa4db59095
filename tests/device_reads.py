"""A counter of the operators that make a GPU wait, usable on any device (tests only)."""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode


class DeviceReads(TorchDispatchMode):
    """A value read into Python, `nonzero`, an index or write through a boolean mask (their output
    sizes depend on the data): on a GPU each waits for every kernel queued before it. `seen`: their
    names, in order."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        masked = name.startswith("index") and any(
            getattr(t, "dtype", None) == torch.bool for a in args if isinstance(a, list | tuple) for t in a
        )
        if name in ("_local_scalar_dense", "nonzero", "masked_select") or masked:
            self.seen.append(name)
        return func(*args, **(kwargs or {}))
