"""Run by tests/test_microbatch.py under `accelerate launch` (two CPU processes): train_vits.py with
each rank's trial timings biased towards a different size, so that only a broadcast choice can make
the ranks agree; each rank writes the size it chose and the one its last step ran at."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import train_vits  # noqa: E402  (first: it sets the threads before torch loads)
from vits_trainer.training import loop, microbatch_choice  # noqa: E402

RANK = int(os.environ.get("RANK", "0"))
PREFERRED = 8 if RANK == 0 else 16  # rank 1 alone would choose 16
real_observe = microbatch_choice.MicroBatchTrial.observe
real_end_run = loop.Trainer.end_run


def observe(self, size, seconds, samples, clean=True, full=True):
    return real_observe(self, size, seconds * (1.0 if size == PREFERRED else 100.0), samples, clean, full)


def end_run(self, stop_reason):
    out = Path(os.environ["MICRO_OUT"]) / f"rank{RANK}.json"
    out.write_text(
        json.dumps({"chosen": self.s.state.micro_batch_size, "last": self.micro_batching.last_micro})
    )
    return real_end_run(self, stop_reason)


microbatch_choice.MicroBatchTrial.observe = observe
loop.Trainer.end_run = end_run

if __name__ == "__main__":
    sys.exit(train_vits.main(sys.argv[1:]))
