"""Run by tests/test_multiprocess.py under `accelerate launch` (two CPU processes): train_vits.py whose
rank 1 alone gets a SIGTERM, sent to itself once its step `SIGNAL_AT_STEP` is measured (a platform or a
user signalling one worker): the run must stop there, on every rank, as after a signal to the main one."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import train_vits  # noqa: E402  (first: it sets the threads before torch loads)
from vits_trainer.training import loop  # noqa: E402

AT_STEP = int(os.environ["SIGNAL_AT_STEP"])
real_measure_step = loop.Trainer.measure_step


def measure_step(self, *args, **kwargs):
    compiling = real_measure_step(self, *args, **kwargs)
    if os.environ.get("RANK") == "1" and self.s.budget.global_step == AT_STEP:
        os.kill(os.getpid(), signal.SIGTERM)  # its handler runs before this step's stop decision
    return compiling


loop.Trainer.measure_step = measure_step

if __name__ == "__main__":
    sys.exit(train_vits.main(sys.argv[1:]))
