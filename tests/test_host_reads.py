"""On a GPU every read of a tensor's value into Python (`.item()`, `.tolist()`, `float(t)`...) waits for
all the work queued before it, and the host cannot queue the next kernels meanwhile. The loop is built to
read once per optimiser step (the finiteness check that decides whether the optimisers step) and once per
metric line. Counted here on the real Trainer (CPU, tiny model) with profiling.HostReads: a read added to
the loop's bookkeeping (budget, logging, the micro-batch trial, recovery) fails this test. The model's own
reads (the CPU alignment search, transformers' text-encoder mask check) are not limited here:
bench/bench_syncs.py lists them."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch

from tests.helpers import tiny_config
from vits_trainer.profiling import DeviceReads, HostReads
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
    step = trainer.train_step

    def counted(*args, **kwargs):  # the optimiser step and all its bookkeeping, logging included
        reads.active = True
        try:
            return step(*args, **kwargs)
        finally:
            reads.active = False

    trainer.train_step = counted
    with reads:
        summary = trainer.train()
    assert summary["steps"] == steps
    outside_model = {where: n for where, n in reads.counts.items() if not where[1].startswith("model/")}
    by_file = {}
    for (method, where), n in outside_model.items():
        by_file[(method, where.split(":")[0])] = by_file.get((method, where.split(":")[0]), 0) + n
    records = [json.loads(line) for line in (Path(cfg.checkpoint_dir) / "metrics.jsonl").open()]
    lines = sum("event" not in r for r in records)  # every log_every steps, more if steps are slow (a minute)
    assert lines >= steps // log_every
    assert by_file == {
        ("tolist", "training/step.py"): steps,  # the finiteness check
        ("tolist", "training/loop.py"): lines,  # a metric line's sums
    }, dict(reads.counts)


def test_the_wait_at_the_steps_read_is_reported_as_the_device_wait(
    tmp_path, tiny_model_dir, tone_corpus, monkeypatch
):
    """On a GPU the host's wait at the step's one read is the GPU computing what the host queued before
    it: `device_wait_fraction` in each step line and the summary says whether the host's launches
    (near 0) or the GPU's work limits the steps. A CPU queues nothing (no such field there); here the
    read is made to take 30 ms, as a GPU with 30 ms of queued work would, and the Trainer is told it
    runs on one (what cannot run here)."""
    from vits_trainer.training.step import GanStep

    read = GanStep._read

    def slow_read(flags):
        time.sleep(0.03)
        return read(flags)

    monkeypatch.setattr(GanStep, "_read", staticmethod(slow_read))
    steps = 4
    cfg = tiny_config(tmp_path, tone_corpus, tiny_model_dir, max_steps=steps, log_every=1, val_fraction=0.0)
    torch.manual_seed(0)
    trainer = Trainer(build_session(cfg, time.time()))
    assert not trainer.reports_device_wait  # a CPU
    trainer.reports_device_wait = True
    measure, measured = trainer.measure_step, []

    def first_compiles(*args, **kwargs):  # as a compiled run's first step: its time is the compiler's
        measured.append(measure(*args, **kwargs))
        return len(measured) == 1 or measured[-1]

    trainer.measure_step = first_compiles
    summary = trainer.train()
    records = [json.loads(line) for line in (Path(cfg.checkpoint_dir) / "metrics.jsonl").open()]
    lines = [r for r in records if "loss_g" in r]
    assert len(lines) == steps
    # a compiling step is neither the host's launches nor the GPU's work: no fraction from it
    assert "compile_seconds" in lines[0] and "device_wait_fraction" not in lines[0]
    # each line is one step (log_every=1): its waited seconds are its share of the step's time
    previous = lines[0]["samples_seen"]
    for r in lines[1:]:
        samples = r["samples_seen"] - previous
        previous = r["samples_seen"]
        seconds = samples / r["samples_per_second"]
        waited = r["device_wait_fraction"] * seconds
        assert 0.03 <= waited < seconds, (waited, seconds)
    assert 0.0 < summary["device_wait_fraction"] < 1.0


def test_a_gpu_session_that_trains_no_step_has_no_device_wait(tmp_path, tiny_model_dir, tone_corpus):
    """A session that trains no step (resumed at its --max_steps, or no step fits the budget) waited for
    nothing: its figure is None, not 0.0, which report.html read as "the host's kernel launches limited
    the steps" of a session that had none."""
    cfg = tiny_config(tmp_path, tone_corpus, tiny_model_dir, max_steps=1, val_fraction=0.0)
    torch.manual_seed(0)
    Trainer(build_session(cfg, time.time())).train()
    trainer = Trainer(build_session(cfg, time.time()))  # resumed at step 1 of --max_steps 1
    trainer.reports_device_wait = True  # as on a GPU
    summary = trainer.train()
    assert summary["stopped_reason"] == "max_steps" and summary["resumed_from_step"] == 1
    assert summary["device_wait_fraction"] is None
    page = (Path(cfg.checkpoint_dir) / "report.html").read_text(encoding="utf-8")
    assert "kernel launches limited" not in page


def test_micro_batches_go_to_a_gpu_from_pinned_memory(monkeypatch):
    """A copy to a GPU from pageable memory may wait for every kernel queued before it. The loader pins
    its batches, but micro-batches merged from several are new tensors: move_batch pins them before
    their non-blocking copy, and copies pinned ones as they are. There is no GPU here, so pinning and
    the copy are stand-ins (is_pinned, pin_memory and .to patched); what is checked is what each copy
    starts from."""
    from vits_trainer.data.loader import move_batch
    from vits_trainer.training.microbatch import micro_batches

    pinned, pins, copies = set(), [], []
    monkeypatch.setattr(torch.Tensor, "is_pinned", lambda self: self.data_ptr() in pinned)

    def pin_memory(self):
        out = self.clone()
        pinned.add(out.data_ptr())
        pins.append(out)
        return out

    monkeypatch.setattr(torch.Tensor, "pin_memory", pin_memory)

    def loader_batch(clips: int, text: int, samples: int) -> dict:
        batch = {
            "input_ids": torch.ones(clips, text, dtype=torch.long),
            "attention_mask": torch.ones(clips, text, dtype=torch.long),
            "audio": torch.ones(clips, 1, samples),
            "audio_lengths": torch.full((clips,), samples),
        }
        pinned.update(v.data_ptr() for v in batch.values())  # as the DataLoader's pinning thread leaves them
        return batch

    def moved(batch: dict, device: str) -> list[tuple[bool, str, bool]]:
        copies.clear()

        def to(self, device, non_blocking=False):
            copies.append((self.is_pinned(), torch.device(device).type, non_blocking))
            return self

        with monkeypatch.context() as m:
            m.setattr(torch.Tensor, "to", to)
            move_batch(batch, torch.device(device))
        return list(copies)

    pending = [loader_batch(2, 5, 40), loader_batch(2, 3, 30)]
    merged = micro_batches(pending, 4)  # one micro-batch of both loader batches: new tensors
    assert len(merged) == 1 and not any(v.is_pinned() for v in merged[0].values())
    assert moved(merged[0], "cuda") == [(True, "cuda", True)] * 4 and len(pins) == 4
    pins.clear()
    as_loaded = micro_batches(pending, 2)  # the loader's own batches: already pinned, not copied again
    assert moved(as_loaded[0], "cuda") == [(True, "cuda", True)] * 4 and not pins
    assert moved(merged[0], "cpu") == [(False, "cpu", True)] * 4 and not pins  # no pinning without a GPU


def test_a_micro_step_neither_waits_for_the_device_nor_copies_to_it(tmp_path, tiny_model_dir, tone_corpus):
    """One micro-step of the GAN step (model, alignment search, losses, backward) queues its work without
    asking the device for a value, and makes no tensor on the host to copy over: on a GPU a copy from
    pageable memory waits for every kernel queued before it, as a read does. With the default device
    set to "meta", a tensor made without naming its device (transformers' duration predictor drew its
    noise so, `torch.randn(...).to(device)`) has no data and cannot be copied, so the step fails there.
    transformers' text encoder asked whether any token is padding (`padding_mask.all()`)."""
    from vits_trainer.data.loader import ClipDataset, collate_batch
    from vits_trainer.training.step import GanStep

    cfg = tiny_config(tmp_path, tone_corpus, tiny_model_dir, max_steps=1)
    torch.manual_seed(0)
    s = build_session(cfg, time.time())
    batch = collate_batch([ClipDataset(s.data.train)[i] for i in range(4)])
    batch = {k: batch[k] for k in ("input_ids", "attention_mask", "audio", "audio_lengths")}
    assert (batch["attention_mask"] == 0).any()  # padded text: the case transformers' check could not skip
    step = GanStep(s.accelerator, s.generator, s.discriminator, s.g_optimizer, s.d_optimizer)
    step(batch, micro_index=0, cycle_length=2)  # first calls (caches, numba) outside the check
    reads = DeviceReads()
    with torch.device("meta"), reads:
        step(batch, micro_index=0, cycle_length=2)
    assert reads.seen == []


def test_an_evaluation_reads_the_device_once_per_validation_set(tmp_path, tiny_model_dir, tone_corpus):
    """Validation goes one clip at a time; a read of each clip's losses into Python made the host wait
    for that clip's forward before it queued the next one, so on a GPU the two took turns. The losses
    stay on the device until the set is done: one read for the means and the voices' scores, one for the
    per-clip scores of a feedback round. (Each clip's speaker ids are read too, from the host batch
    before it moves: no wait.)"""
    from vits_trainer.training.evaluate import evaluate, evaluate_per_clip

    cfg = tiny_config(tmp_path, tone_corpus, tiny_model_dir, max_steps=1, val_fraction=0.05)
    s = build_session(cfg, time.time())
    batches = list(s.val_loaders["val"])  # the DataLoader draws a seed on the host when it starts
    assert len(batches) >= 4  # several clips, so a read per clip would show
    reads, voices = HostReads(), {}
    with reads:
        result = evaluate(s.generator_raw, batches, s.device, weights=cfg.loss_weights(), by_speaker=voices)
    outside_model = {where: n for where, n in reads.counts.items() if not where[1].startswith("model/")}
    by_method = {}
    for (method, _), n in outside_model.items():
        by_method[method] = by_method.get(method, 0) + n
    assert by_method == {"tolist": len(batches) + 1}, outside_model  # the speaker ids, and the losses once
    assert voices == {0: (pytest.approx(result["val_mel"]), len(batches))}

    items = s.data.val_sets["val"]
    reads = HostReads()
    with reads:
        per_clip = evaluate_per_clip(s.generator_raw, items, s.device)
    outside_model = {where: n for where, n in reads.counts.items() if not where[1].startswith("model/")}
    assert list(outside_model.values()) == [1], outside_model
    assert len(per_clip) == len(items)
