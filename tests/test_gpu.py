"""The CUDA paths: mixed precision, the GPU alignment search, recovery out of fp16, the runner on a GPU.

CI has no GPU, so every test here is skipped there; they run on a machine with one (`bash bench/gpu_check.sh
LOG_DIR`, see docs/performance.md). They use the same tiny model and tone-language corpus
as the CPU tests, with `cpu=False`.
"""

from __future__ import annotations

import json
import subprocess
import time

import pytest
import torch
from transformers import VitsModel

from tests.helpers import (
    COMPILE_ON_STEPS,
    PYTHON,
    ROOT,
    all_finite,
    cli_args,
    cli_settings,
    make_kl_infinite,
    train_tiny,
)
from vits_trainer.training.runtime import native_bf16

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def gpu_run(tmp, data, model, **overrides):
    return train_tiny(tmp, data, model, cpu=False, **overrides)


def steps_of(tmp) -> list[dict]:
    lines = (tmp / "checkpoints" / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if "lr" in r]


@pytest.mark.parametrize("precision", ["no", "fp16", "bf16"])
def test_training_on_the_gpu_stays_finite_and_learns(tmp_path, tiny_model_dir, tone_corpus, precision):
    session, summary = gpu_run(
        tmp_path, tone_corpus, tiny_model_dir, max_steps=40, mixed_precision=precision, log_every=1
    )
    assert session.device.type == "cuda"
    assert next(session.model.parameters()).is_cuda
    assert session.accelerator.mixed_precision == precision
    if precision == "fp16":
        assert session.accelerator.scaler is not None
        assert session.accelerator.scaler.get_scale() <= 1024.0  # the conservative start, never above
    # fp16 may skip a few steps while its scaler lowers the loss scale; that is never a recovery
    assert summary["steps"] == 40 and session.state.recoveries == 0
    assert summary["skipped_steps"] <= (15 if precision == "fp16" else 0)
    assert all_finite(session.model, session.discriminator_raw)
    mel = [r["mel"] for r in steps_of(tmp_path)]
    assert sum(mel[-5:]) / 5 < 0.8 * sum(mel[:5]) / 5, mel
    assert any(r.get("vram_gb") for r in steps_of(tmp_path))
    # the host's wait at each step's read for the GPU's queued work: a share of the steps' time
    assert all(0.0 <= r["device_wait_fraction"] < 1.0 for r in steps_of(tmp_path))
    assert 0.0 < summary["device_wait_fraction"] < 1.0
    VitsModel.from_pretrained(tmp_path / "final_model")


def test_repeated_inf_loss_under_fp16_recovers_into_bf16(
    tmp_path, tiny_model_dir, tone_corpus, monkeypatch, capsys
):
    make_kl_infinite(monkeypatch, 5, 7)  # steps 5-7: the KL term is Inf
    session, summary = gpu_run(
        tmp_path,
        tone_corpus,
        tiny_model_dir,
        max_steps=12,
        mixed_precision="fp16",
        max_consecutive_skips=3,
        save_minutes=0.001,
    )
    out = capsys.readouterr().out
    expected = "bf16" if native_bf16() else "no"
    assert session.state.recoveries == 1 and session.accelerator.mixed_precision == expected
    assert session.accelerator.scaler is None
    assert "fp16" in out and "recovery" in out
    assert summary["steps"] == 12
    assert all_finite(session.model, session.discriminator_raw)


def test_runner_cli_on_the_gpu_keeps_its_budget(tmp_path, tiny_model_dir, tone_corpus):
    """train_vits.py with its GPU defaults (bf16 on Ampere and newer, else fp16; GPU alignment search;
    length buckets; compile decided by the budget) inside a 60 s budget."""
    settings = cli_settings(tmp_path, tone_corpus, tiny_model_dir, save_minutes=0.25, target_hours=60 / 3600)
    settings.pop("cpu")
    start = time.monotonic()
    proc = subprocess.run(
        [PYTHON, str(ROOT / "train_vits.py"), *cli_args(settings)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    wall = time.monotonic() - start
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert 0.97 * 60 <= wall <= 70, f"wall {wall:.1f} s\n{proc.stdout[-6000:]}"
    summary = json.loads((tmp_path / "final_model" / "train_summary.json").read_text())
    assert summary["stopped_reason"] == "budget"
    assert ("bf16" if native_bf16() else "fp16") in proc.stdout
    VitsModel.from_pretrained(tmp_path / "final_model")


def test_free_running_evaluation_and_a_second_voice_on_the_gpu(tmp_path, tiny_model_dir):
    """What the CPU tests check of free-running evaluation (speech from text alone, its scores and
    pictures: tests/test_freerun.py) and of a voice added to a single-speaker model
    (tests/test_speakers.py), in one run on the GPU."""
    import math

    from vits_trainer.data.synthetic import make_corpus

    corpus = tmp_path / "corpus"
    make_corpus(corpus, num_clips=24, num_speakers=2, seed=3)
    session, summary = gpu_run(
        tmp_path,
        corpus,
        tiny_model_dir,
        max_steps=4,
        num_speakers="auto",
        val_fraction=0.2,
        eval_samples=2,
        freerun_samples=2,
    )
    assert session.device.type == "cuda" and summary["steps"] == 4
    evals = [
        r
        for r in map(json.loads, (tmp_path / "checkpoints" / "metrics.jsonl").read_text().splitlines())
        if r.get("event") == "eval"
    ]
    assert [e["tag"] for e in evals] == ["start", "final"]
    for record in evals:
        for key in ("val_mel_dtw", "val_mcd", "val_duration_ratio"):
            assert math.isfinite(record[key]) and record[key] >= 0, record
        assert sorted(record["by_speaker"]) == ["0", "1"], record
    final = tmp_path / "checkpoints" / "samples" / f"step_{evals[-1]['step']:08d}"
    assert list(final.glob("*_alignment.png")) and list(final.glob("*_mel.png")) and list(final.glob("*.wav"))
    model = VitsModel.from_pretrained(tmp_path / "final_model")
    assert model.config.num_speakers == 2


def sigterm_then_resume(tmp, data, model, cpu: bool, precision: str, monkeypatch) -> dict:
    """A run stopped by SIGTERM at its 6th batch, then resumed for 3 more steps: what a Kaggle or Colab
    session's end and the next session do. Checks the stop and the resume; returns what the checkpoint
    held and the resumed session saw (on the CPU too: `cpu=True`, for the test's own check)."""
    from tests.helpers import sigterm_at_batch, tiny_config
    from vits_trainer.training.checkpoint import find_resumable
    from vits_trainer.training.loop import Trainer
    from vits_trainer.training.session import build_session
    from vits_trainer.training.trainstate import LoadedCheckpoint

    settings = dict(mixed_precision=precision, log_every=1, save_minutes=60)
    real_move = sigterm_at_batch(monkeypatch, 6)
    _, first = train_tiny(tmp, data, model, cpu=cpu, max_steps=50, **settings)
    monkeypatch.setattr("vits_trainer.training.loop.move_batch", real_move)
    assert first["stopped_reason"] == "signal" and 1 <= first["steps"] < 50, first
    saved, manifest = find_resumable(tmp / "checkpoints", log=lambda *a: None)
    assert manifest is not None and manifest["step"] == first["steps"], manifest
    ckpt = LoadedCheckpoint(saved, manifest)
    seen = {"saved": saved, "first": first, "cuda_rng": "cuda" in ckpt.object("rng.pt")}
    if ckpt.has("scaler.pt"):
        seen["saved_scale"] = float(ckpt.object("scaler.pt")["scale"])
    cfg = tiny_config(tmp, data, model, cpu=cpu, max_steps=first["steps"] + 3, resume="auto", **settings)
    torch.manual_seed(0)
    session = build_session(cfg, time.time())
    if session.accelerator.scaler is not None:
        seen["resumed_scale"] = float(session.accelerator.scaler.get_scale())
    second = Trainer(session).train()
    assert second["resumed_from_step"] == first["steps"] and second["steps"] == first["steps"] + 3, second
    assert second["stopped_reason"] != "signal" and all_finite(session.model, session.discriminator_raw)
    VitsModel.from_pretrained(tmp / "final_model")
    seen["second"] = second
    return seen


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_sigterm_and_resume_on_the_gpu(tmp_path, tiny_model_dir, tone_corpus, monkeypatch, precision):
    """SIGTERM mid-run on the GPU saves a checkpoint that resumes there: the GPU's random state is in
    it, and in fp16 the loss scaler's scale comes back as it was (a fresh scaler would start high again
    and skip steps while it calibrates)."""
    seen = sigterm_then_resume(tmp_path, tone_corpus, tiny_model_dir, False, precision, monkeypatch)
    assert seen["cuda_rng"]
    if precision == "fp16":
        assert seen["resumed_scale"] == seen["saved_scale"], seen
    else:
        assert "saved_scale" not in seen and "resumed_scale" not in seen


@pytest.mark.parametrize("scope", ["segments", "fused", "graphs"])
def test_compiled_step_with_cuda_graphs_gives_the_eager_losses(
    tmp_path, tiny_model_dir, tone_corpus, monkeypatch, scope
):
    """The default backend (inductor) with CUDA graphs against the eager step: 3 optimiser steps from the
    same weights on the same batch, then one of two micro-batches (the CPU test uses the aot_eager
    backend), in each scope. The
    utterance parts draw random numbers (dropout, the posterior's and duration predictor's noise):
    inductor draws them with torch's own generator, as eager does, so both see the same numbers."""
    import torch._inductor.config as inductor_config

    monkeypatch.setattr(inductor_config, "fallback_random", True)
    from tests.helpers import tiny_config
    from tests.test_compile import _run_steps
    from tests.test_vits_training import one_batch
    from vits_trainer.data.loader import move_batch
    from vits_trainer.training.session import build_session
    from vits_trainer.training.step import GanStep

    results = {}
    for mode in ("eager", "compiled"):
        cfg = tiny_config(tmp_path / mode, tone_corpus, tiny_model_dir, max_steps=1, cpu=False)
        torch.manual_seed(0)
        s = build_session(cfg, time.time())
        step = GanStep(s.accelerator, s.generator, s.discriminator, s.g_optimizer, s.d_optimizer)
        step.use_compiled(mode == "compiled", scope=scope)
        assert step.stable_grads == (mode == "compiled")
        batch = move_batch(one_batch(s), s.device)
        results[mode] = _run_steps(step, batch, 3)
        # a cycle of two micro-batches: the second adds to the first's gradients, which a CUDA graph's
        # replay would overwrite were they its output (step.py's `stable_grads`)
        for i in (0, 1):
            torch.manual_seed(200 + i)
            last = step(batch, micro_index=i, cycle_length=2)
        results[mode].append({k: float(v) for k, v in last.metrics.items()})
    for eager, comp in zip(results["eager"], results["compiled"], strict=True):
        for key in eager:
            assert comp[key] == pytest.approx(eager[key], rel=2e-3, abs=1e-5), key


def test_runner_with_compile_on_the_gpu(tmp_path, tiny_model_dir, tone_corpus, capsys):
    session, summary = gpu_run(
        tmp_path, tone_corpus, tiny_model_dir, max_steps=COMPILE_ON_STEPS, compile="on"
    )
    out = capsys.readouterr().out
    assert summary["compile"]["state"] == "on", out[-4000:]
    assert set(summary["compile"]["seconds_per_sample_by_scope"]) == {"graphs", "segments"}, out[-4000:]
    assert summary["length_buckets"] is True and summary["steps"] == COMPILE_ON_STEPS
    assert "(as CUDA graphs, one per path of batch shapes)" in out
    assert " | compiling " in out  # the step lines whose steps compiled or recorded say so
    assert all_finite(session.model, session.discriminator_raw)


@pytest.mark.parametrize("precision", ["no", "bf16"])
def test_a_micro_step_on_the_gpu_never_waits_for_it(tmp_path, tiny_model_dir, tone_corpus, precision):
    """With `torch.cuda.set_sync_debug_mode("error")` every call that synchronises raises (a value read,
    a copy from pageable memory, a data-sized result), naming its place. One micro-step (forward, the
    alignment search on the GPU, the losses, backward; not the optimiser step, whose finiteness check
    reads once by design) must queue all its work. tests/test_host_reads.py checks the same on a CPU."""
    from tests.helpers import tiny_config
    from tests.test_vits_training import one_batch
    from vits_trainer.data.loader import move_batch
    from vits_trainer.training.session import build_session
    from vits_trainer.training.step import GanStep

    cfg = tiny_config(
        tmp_path, tone_corpus, tiny_model_dir, max_steps=1, cpu=False, mixed_precision=precision
    )
    torch.manual_seed(0)
    s = build_session(cfg, time.time())
    step = GanStep(s.accelerator, s.generator, s.discriminator, s.g_optimizer, s.d_optimizer)
    batch = move_batch(one_batch(s), s.device)
    step(batch, micro_index=0, cycle_length=2)  # first calls: caches, Triton's compilation
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        result = step(batch, micro_index=0, cycle_length=2)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    assert not result.synced
