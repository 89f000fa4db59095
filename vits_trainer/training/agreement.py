"""The main process's decisions, the same on every rank.

Decisions that lead to collective operations (an evaluation, a checkpoint, a micro-batch size) are
taken on rank 0 and broadcast, so no rank waits on a collective the others skip. In a single process
the value is returned as it is.
"""

from __future__ import annotations

import torch


class Agreement:
    def __init__(self, accelerator) -> None:
        self.accelerator = accelerator

    def flag(self, value: bool) -> bool:
        """The main process's yes/no on every rank."""
        return bool(self.integer(int(value)))

    def integer(self, value: int) -> int:
        """The main process's integer on every rank."""
        if self.accelerator.num_processes == 1:
            return value
        from accelerate.utils import broadcast

        packet = torch.tensor([float(value)], device=self.accelerator.device)
        return int(broadcast(packet, from_process=0).item())
