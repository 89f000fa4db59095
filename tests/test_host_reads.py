"""On a GPU every read of a tensor's value into Python (`.item()`, `.tolist()`, `float(t)`...) waits for
all the work queued before it, and the host cannot queue the next kernels meanwhile. The loop is built to
read once per optimiser step (the finiteness check that decides whether the optimisers step) and once per
metric line. Counted here on the real Trainer (CPU, tiny model) with profiling.HostReads: a read added to
the loop's bookkeeping (budget, logging, the micro-batch trial, recovery) fails this test. The model's own
reads (the CPU alignment search, transformers' text-encoder mask check) are not limited here:
bench/bench_syncs.py lists them."""

from __future__ import annotations

import time

import torch

from tests.helpers import tiny_config
from vits_trainer.profiling import HostReads
from vits_trainer.training.loop import Trainer
from vits_trainer.training.session import build_session


def test_the_loop_reads_the_device_once_per_step_and_once_per_metric_line(
    tmp_path, tiny_model_dir, tone_corpus
):
    steps, log_every = 8, 4
    cfg = tiny_config(
        tmp_path, tone_corpus, tiny_model_dir, max_steps=steps, log_every=log_every, val_fraction=0.0
    )
    torch.manual_seed(0)
    trainer = Trainer(build_session(cfg, time.time()))
    reads = HostReads()
    reads.active = False
    step = trainer.optimizer_step

    def counted(*args, **kwargs):  # the optimiser step and all its bookkeeping, logging included
        reads.active = True
        try:
            return step(*args, **kwargs)
        finally:
            reads.active = False

    trainer.optimizer_step = counted
    with reads:
        summary = trainer.train()
    assert summary["steps"] == steps
    outside_model = {where: n for where, n in reads.counts.items() if not where[1].startswith("model/")}
    by_file = {}
    for (method, where), n in outside_model.items():
        by_file[(method, where.split(":")[0])] = by_file.get((method, where.split(":")[0]), 0) + n
    assert by_file == {
        ("tolist", "training/step.py"): steps,  # the finiteness check
        ("tolist", "training/loop.py"): steps // log_every,  # a metric line's sums
    }, dict(reads.counts)
