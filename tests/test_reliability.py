"""Fault injection: training that cannot silently die, corrupt its checkpoints or lose work.

Faults are injected by patching the project's own functions in-process (a NaN batch, an Inf loss,
an out-of-memory error, a full disk) — a real CUDA OOM or a full disk cannot be produced here — and
by killing real training subprocesses.
"""

from __future__ import annotations

import errno
import json
import random
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch
from transformers import VitsModel

import vits_trainer.training.loop as loop_module
import vits_trainer.training.outputs as outputs_module
from tests.helpers import (
    PYTHON,
    ROOT,
    TINY_SETTINGS,
    all_finite,
    cli_args,
    cli_settings,
    make_kl_infinite,
    tiny_config,
    train_tiny,
)
from vits_trainer.errors import UserError
from vits_trainer.training.checkpoint import (
    find_resumable,
    list_checkpoints,
    prune_checkpoints,
    write_checkpoint,
)
from vits_trainer.training.loop import Trainer
from vits_trainer.training.session import build_session
from vits_trainer.training.step import GanStep


def events(tmp: Path, name: str) -> list[dict]:
    path = tmp / "checkpoints" / "metrics.jsonl"
    return [r for r in map(json.loads, path.read_text().splitlines()) if r.get("event") == name]


def test_nan_batch_is_skipped_for_both_networks(tmp_path, tiny_model_dir, tone_corpus, monkeypatch, capsys):
    calls = {"n": 0}
    real_move = loop_module.move_batch

    def poisoned_move(batch, device):
        calls["n"] += 1
        batch = real_move(batch, device)
        if calls["n"] == 4:  # the 4th micro-batch carries NaN audio
            batch["audio"] = batch["audio"].clone()
            batch["audio"][0, 0, 100:200] = float("nan")
        return batch

    monkeypatch.setattr(loop_module, "move_batch", poisoned_move)
    session, summary = train_tiny(tmp_path, tone_corpus, tiny_model_dir, max_steps=8)
    assert summary["skipped_steps"] == 1 and summary["steps"] == 8
    assert all_finite(session.model, session.discriminator_raw)
    skipped = events(tmp_path, "skipped")
    assert len(skipped) == 1 and skipped[0]["step"] == 4 and len(skipped[0]["clips"]) == 8
    assert "step 4 skipped" in capsys.readouterr().out


def test_non_finite_step_changes_no_weight(tmp_path, tiny_model_dir, tone_corpus):
    cfg = tiny_config(tmp_path, tone_corpus, tiny_model_dir, max_steps=1)
    s = build_session(cfg, time.time())
    from tests.test_vits_training import one_batch

    batch = one_batch(s)
    batch["audio"][1, 0, :50] = float("inf")
    assert_step_skipped_with_no_weight_changed(s, batch)
    assert not s.g_optimizer.state and not s.d_optimizer.state  # AdamW never stepped


def assert_step_skipped_with_no_weight_changed(s, batch) -> None:
    """One optimiser step of `batch` in session `s`: skipped, both networks' weights as they were."""
    before_g = {k: v.clone() for k, v in s.model.state_dict().items()}
    before_d = {k: v.clone() for k, v in s.discriminator_raw.state_dict().items()}
    result = GanStep(s.accelerator, s.generator, s.discriminator, s.g_optimizer, s.d_optimizer)(batch)
    assert result.synced and result.skipped
    assert all(torch.equal(v, before_g[k]) for k, v in s.model.state_dict().items())
    assert all(torch.equal(v, before_d[k]) for k, v in s.discriminator_raw.state_dict().items())


@pytest.mark.parametrize("network", ["generator", "discriminator"])
def test_a_non_finite_gradient_behind_finite_losses_changes_no_weight(
    tmp_path, tiny_model_dir, tone_corpus, network
):
    """fp32 (no loss scaler to catch it): both losses finite, one weight's gradient NaN (as an overflow in
    a backward gives). Only the gradient norms show it; the step must be skipped like a NaN loss."""
    cfg = tiny_config(tmp_path, tone_corpus, tiny_model_dir, max_steps=1)
    s = build_session(cfg, time.time())
    assert s.accelerator.scaler is None
    from tests.test_vits_training import one_batch

    batch = one_batch(s)
    net = s.model if network == "generator" else s.discriminator_raw
    next(net.parameters()).register_hook(lambda grad: grad * float("nan"))
    assert_step_skipped_with_no_weight_changed(s, batch)


def test_fp16_gradient_overflow_lowers_the_loss_scale_without_a_recovery(
    tmp_path, tiny_model_dir, tone_corpus, capsys
):
    """fp16's GradScaler calibrating itself is not a fault. No fp16 here (no GPU), so a CPU GradScaler is
    put in its place (accelerate's backward and the step use `accelerator.scaler` alike) and the
    overflow is injected as an Inf gradient in one generator weight for 10 steps in a row."""
    cfg = tiny_config(
        tmp_path, tone_corpus, tiny_model_dir, max_steps=14, max_consecutive_skips=3, log_every=1
    )
    session = build_session(cfg, time.time())
    session.accelerator.scaler = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=1000)
    calls = {"n": 0}

    def overflow(grad):
        calls["n"] += 1
        return grad * float("inf") if 3 <= calls["n"] <= 12 else grad

    next(session.model.decoder.parameters()).register_hook(overflow)
    summary = Trainer(session).train()
    out = capsys.readouterr().out
    assert summary["steps"] == 14 and summary["skipped_steps"] == 10
    assert session.state.recoveries == 0 and "recovery" not in out  # 10 > --max_consecutive_skips 3
    assert "fp16: gradients overflowed at step 3, loss scale 1024 -> 512; step skipped" in out
    overflows = events(tmp_path, "overflow")
    assert [e["step"] for e in overflows] == list(range(3, 13)) and overflows[-1]["scale"] == 1.0
    assert session.accelerator.scaler.get_scale() == 1.0
    assert all_finite(session.model, session.discriminator_raw)


def test_repeated_inf_loss_triggers_recovery(tmp_path, tiny_model_dir, tone_corpus, monkeypatch, capsys):
    make_kl_infinite(monkeypatch, 5, 7)  # steps 5-7: the KL term is Inf
    session, summary = train_tiny(
        tmp_path,
        tone_corpus,
        tiny_model_dir,
        max_steps=9,
        max_consecutive_skips=3,
        save_minutes=0.001,
        log_every=1,
    )
    out = capsys.readouterr().out
    state = session.state
    assert summary["skipped_steps"] == 3 and summary["steps"] == 9
    assert state.recoveries == 1 and state.lr_scale == 0.5 and state.consecutive_skips == 0
    assert "recovery: 3 non-finite steps in a row; reloaded checkpoint step_0000000" in out
    assert "learning rate halved" in out
    recovery = events(tmp_path, "recovery")
    assert len(recovery) == 1 and recovery[0]["step"] == 7 and recovery[0]["lr_scale"] == 0.5
    peak = [g["initial_lr"] for g in session.g_optimizer.param_groups]
    assert peak == [0.5 * TINY_SETTINGS["learning_rate"]]
    assert all_finite(session.model, session.discriminator_raw)
    steps = [
        r
        for r in map(json.loads, (tmp_path / "checkpoints" / "metrics.jsonl").read_text().splitlines())
        if "lr" in r
    ]
    assert steps[-1]["recoveries"] == 1
    VitsModel.from_pretrained(tmp_path / "final_model")


def test_recovery_passes_over_a_checkpoint_saved_after_the_weights_broke(
    tmp_path, tiny_model_dir, tone_corpus, monkeypatch, capsys
):
    """--learning_rate 1 on the demo: one finite step gives weights whose every later step is NaN, and the
    checkpoint saved after it holds them. Reloading that one was stuck again at once, recovery after
    recovery to the end of the budget. Here step 2's update is made to break a decoder weight (NaN)."""
    real_step = GanStep._optimizer_step
    calls = {"n": 0}

    def breaking_step(self, metrics):
        result = real_step(self, metrics)
        calls["n"] += 1
        if calls["n"] == 2:
            with torch.no_grad():
                next(self.generator_raw.model.decoder.parameters()).fill_(float("nan"))
        return result

    monkeypatch.setattr(GanStep, "_optimizer_step", breaking_step)
    session, summary = train_tiny(
        tmp_path,
        tone_corpus,
        tiny_model_dir,
        max_steps=8,
        max_consecutive_skips=3,
        save_minutes=0.001,  # a checkpoint after every step that may take one
        log_every=1,
    )
    out = capsys.readouterr().out
    assert "warning: step 3 skipped" in out  # the broken weights' first step
    assert session.state.recoveries == 1 and summary["skipped_steps"] == 3
    assert "reloaded checkpoint step_00000001 (not step_00000002: no finite step since it was saved)" in out
    assert all_finite(session.model, session.discriminator_raw)


def test_weights_broken_by_the_last_step_are_not_exported_as_the_final_model(
    tmp_path, tiny_model_dir, tone_corpus, monkeypatch, capsys
):
    """The last step's update leaves NaN in a decoder weight (its losses were finite, so it was not
    skipped). The final model was exported with them, and the run ended `done:` as if it went well."""
    real_step = GanStep._optimizer_step
    calls = {"n": 0}

    def breaking_step(self, metrics):
        result = real_step(self, metrics)
        calls["n"] += 1
        if calls["n"] == 3:
            with torch.no_grad():
                next(self.generator_raw.model.decoder.parameters()).fill_(float("nan"))
        return result

    monkeypatch.setattr(GanStep, "_optimizer_step", breaking_step)
    session, summary = train_tiny(tmp_path, tone_corpus, tiny_model_dir, max_steps=3)
    out = capsys.readouterr().out
    assert summary["final_model"] is None and not (tmp_path / "final_model").exists()
    assert "error: training diverged: 1 of the final weights' tensors hold NaN/Inf values" in out
    assert "step_00000003 holds them" in out and "lower --learning_rate" in out
    assert summary["diverged"].startswith("1 of the final weights")
    # strict JSON (jq, a browser's JSON.parse refuse NaN): the diverged scores are null
    written = strict_loads((tmp_path / "checkpoints" / "train_summary.json").read_text())
    assert written["final_model"] is None and written["diverged"]
    assert written["final_val"]["val_mel"] is None
    records = [
        strict_loads(line) for line in (tmp_path / "checkpoints" / "metrics.jsonl").read_text().splitlines()
    ]
    final = [r for r in records if r.get("event") == "eval" and r["tag"] == "final"]
    assert final and final[0]["val_mel"] is None
    from vits_trainer.training.report import REPORT_FILE

    assert "non-finite" in (tmp_path / "checkpoints" / REPORT_FILE).read_text()


def strict_loads(text: str):
    """json.loads as strict readers parse: NaN, Infinity and -Infinity are not JSON."""

    def refuse(word):
        raise ValueError(f"{word} is not JSON")

    return json.loads(text, parse_constant=refuse)


def test_finite_weights_whose_evaluation_is_nan_count_as_diverged():
    """--learning_rate 1 on the demo: finite weights (the largest 1.99) whose val_mel is NaN. Stand-ins for
    the session and the outputs: what `diverged` reads of them."""
    from types import SimpleNamespace

    from vits_trainer.training.run_end import RunEnd

    def end(val_mel, step=30, scored_step=30, best_metric="val_mel"):
        run_end = RunEnd.__new__(RunEnd)
        run_end.s = SimpleNamespace(
            model=torch.nn.Linear(2, 2),
            budget=SimpleNamespace(global_step=step),
            cfg=SimpleNamespace(best_metric=best_metric),
        )
        run_end.outputs = SimpleNamespace(
            last_val_step=scored_step,
            last_val={"val_mel": val_mel, "val_mel_dtw": 3.97},
            best_key=lambda: best_metric,
        )
        return run_end.diverged()

    assert end(float("nan")) == "the final weights' val_mel is nan (their evaluation at step 30)"
    assert end(float("nan"), best_metric="val_mel_dtw").startswith("the final weights' val_mel is nan")
    assert end(1.2) is None
    assert end(float("nan"), scored_step=20) is None  # an earlier evaluation scored other weights


def test_every_rank_learns_of_the_newest_checkpoint(tmp_path):
    """Only rank 0 writes a checkpoint, but a recovery reloads the newest one on every rank (the skip that
    starts it is agreed on every rank). Once, the other ranks never learned of a new checkpoint and
    reloaded the starting weights while rank 0 reloaded step 7: replicas of different weights, training
    on without an error. A stand-in for a second process (no process group here)."""
    from types import SimpleNamespace

    from vits_trainer.training.outputs import RunOutputs

    def other_rank(rank0_wrote: bool):
        outputs = RunOutputs.__new__(RunOutputs)
        outputs.s = SimpleNamespace(
            is_main=False,
            checkpoint_dir=tmp_path,
            budget=SimpleNamespace(global_step=7, observe_save=lambda seconds: None),
            accelerator=SimpleNamespace(wait_for_everyone=lambda: None),
        )
        outputs.agreement = SimpleNamespace(flag=lambda value: rank0_wrote)  # rank 0's answer
        outputs.last_checkpoint = tmp_path / "step_00000003"
        assert outputs.save_checkpoint("interval") is None  # it writes nothing itself
        return outputs.last_checkpoint

    assert other_rank(True) == tmp_path / "step_00000007"
    assert other_rank(False) == tmp_path / "step_00000003"  # rank 0's write failed: the older one


def test_the_launchers_copy_of_a_signal_is_not_a_second_one(monkeypatch):
    """Ctrl-C on `accelerate launch` reaches each worker twice within milliseconds (its process group's
    SIGINT, then the launcher's forwarded SIGINT or SIGTERM): once, the second copy ended every rank at
    once, without a checkpoint or final model. Several processes take a repeat that soon for the same
    stop; a later one still exits at once."""
    exits = []
    monkeypatch.setattr(loop_module.os, "_exit", exits.append)
    lines = []
    stop = loop_module.SignalStop(lines.append, repeat_grace=loop_module.REPEAT_GRACE_SECONDS)
    try:
        stop._handle(signal.SIGINT, None)
        stop._handle(signal.SIGTERM, None)  # the launcher's copy
        assert exits == [] and stop.received == "SIGINT" and len(lines) == 1
        stop.received_at -= loop_module.REPEAT_GRACE_SECONDS  # a second Ctrl-C, seconds later
        stop._handle(signal.SIGINT, None)
        assert exits == [128 + signal.SIGINT]
    finally:
        stop.restore()


def test_recovery_leaves_mixed_precision(tmp_path, tiny_model_dir, tone_corpus):
    """bf16 -> fp32 on this CPU (fp16 needs a GPU: there it goes fp16 -> bf16 or fp32, same code)."""
    from tests.test_vits_training import one_batch
    from vits_trainer.training.recovery import next_precision, switch_precision

    cfg = tiny_config(tmp_path, tone_corpus, tiny_model_dir, max_steps=1, mixed_precision="bf16")
    s = build_session(cfg, time.time())
    acc = s.accelerator
    assert acc.mixed_precision == "bf16" and "_original_forward" in s.generator_raw.__dict__
    with acc.autocast():
        assert torch.get_autocast_dtype("cpu") == torch.bfloat16 and torch.is_autocast_enabled("cpu")
    assert next_precision("bf16") == "no" and next_precision("no") is None
    switch_precision(acc, [s.generator_raw, s.discriminator_raw], "no")
    assert acc.mixed_precision == "no" and acc.scaler is None
    assert "forward" not in s.generator_raw.__dict__  # accelerate's bf16 wrapper is gone
    with acc.autocast():
        assert not torch.is_autocast_enabled("cpu")
    result = GanStep(acc, s.generator, s.discriminator, s.g_optimizer, s.d_optimizer)(one_batch(s, 2))
    assert result.synced and not result.skipped


def test_out_of_memory_halves_the_micro_batch_and_retries(
    tmp_path, tiny_model_dir, tone_corpus, monkeypatch, capsys
):
    """Also: each step runs as several micro-batches, and a metric line averages the losses over them
    but the gradient norms (computed once per step) over its steps; a redone cycle counts once."""
    import vits_trainer.training.step as step_module

    calls = {"n": 0, "sizes": []}
    real = GanStep.micro_step
    norms, clip = [], step_module.clip_grad_norm

    def recorded(params, max_norm):
        norms.append(float(norm := clip(params, max_norm)))
        return norm

    def flaky(self, batch, first, last, scale):
        calls["n"] += 1
        calls["sizes"].append(batch["input_ids"].size(0))
        if calls["n"] == 5:  # simulated: a real CUDA OOM cannot happen on this CPU machine
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(self, batch, first, last, scale)

    monkeypatch.setattr(GanStep, "micro_step", flaky)
    monkeypatch.setattr(step_module, "clip_grad_norm", recorded)
    session, summary = train_tiny(
        tmp_path,
        tone_corpus,
        tiny_model_dir,
        max_steps=8,
        gradient_accumulation_steps=2,
        micro_batch_size="8",  # pinned: the OOM counted here must hit the requested split, not a trial
        log_every=1,
    )
    out = capsys.readouterr().out
    assert "out of memory at step 3: micro-batch 8 -> 4 clips, gradient accumulation 2 -> 4" in out
    assert session.state.split == 2 and summary["steps"] == 8 and summary["skipped_steps"] == 0
    # the same effective batch: every optimiser step still consumed 2 loader batches
    # (36 training clips: an epoch's last loader batch has 4, so a cycle holds 12 to 16 clips)
    assert 8 * 12 <= session.state.samples_seen <= 8 * 16
    assert max(calls["sizes"][5:]) <= 4
    assert events(tmp_path, "oom")[0]["split"] == 2
    lines = [
        r for r in map(json.loads, (tmp_path / "checkpoints" / "metrics.jsonl").open()) if "event" not in r
    ]
    assert [r["step"] for r in lines] == list(range(1, 9))
    for line, norm_d, norm_g in zip(lines, norms[::2], norms[1::2], strict=True):
        assert line["grad_norm_d"] == pytest.approx(norm_d, rel=1e-5)
        assert line["grad_norm_g"] == pytest.approx(norm_g, rel=1e-5)
    # resumed with the same size: the split holds, and the one line saying so gives the size it runs
    monkeypatch.setattr(GanStep, "micro_step", real)
    session, _ = train_tiny(
        tmp_path,
        tone_corpus,
        tiny_model_dir,
        max_steps=9,
        gradient_accumulation_steps=2,
        micro_batch_size="8",
    )
    out = capsys.readouterr().out
    assert session.state.split == 2 and "divided by 2" in out
    assert (
        "micro-batch: 4 clips x 4 (gradient accumulation) = 16 clips per optimiser step (--micro_batch_size 8, "
        in out
    )


def test_out_of_memory_at_batch_one_is_a_clear_error(tmp_path, tiny_model_dir, tone_corpus, monkeypatch):
    def always_oom(self, *args):
        raise torch.OutOfMemoryError("CUDA out of memory")

    monkeypatch.setattr(GanStep, "micro_step", always_oom)
    with pytest.raises(UserError, match="even with a micro-batch of 1 clip"):
        train_tiny(tmp_path, tone_corpus, tiny_model_dir, max_steps=2, batch_size=2)


def test_disk_full_during_save_keeps_training(tmp_path, tiny_model_dir, tone_corpus, monkeypatch, capsys):
    calls = {"n": 0}
    real = outputs_module.write_checkpoint

    def full_once(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(*args, **kwargs)

    monkeypatch.setattr(outputs_module, "write_checkpoint", full_once)
    session, summary = train_tiny(tmp_path, tone_corpus, tiny_model_dir, max_steps=12, save_minutes=0.001)
    out = capsys.readouterr().out
    assert "failed (No space left on device); the previous one is intact" in out
    assert calls["n"] >= 3 and summary["steps"] == 12
    assert list_checkpoints(tmp_path / "checkpoints")[0].name == "step_00000012"
    assert not list((tmp_path / "checkpoints").glob(".step_*"))


def test_failed_final_export_names_the_last_checkpoint(
    tmp_path, tiny_model_dir, tone_corpus, monkeypatch, capsys
):
    real = outputs_module.export_model

    def fail_final(model, tokenizer, folder, *args, **kwargs):
        if Path(folder).name == "final_model":
            raise OSError(errno.EIO, "Input/output error")
        return real(model, tokenizer, folder, *args, **kwargs)

    monkeypatch.setattr(outputs_module, "export_model", fail_final)
    _, summary = train_tiny(tmp_path, tone_corpus, tiny_model_dir, max_steps=3)
    out = capsys.readouterr().out
    assert summary["final_model"] is None
    assert "exporting the final model" in out and "step_00000003" in out


def test_disk_full_during_exports_keeps_training_and_says_so(
    tmp_path, tiny_model_dir, tone_corpus, monkeypatch, capsys
):
    """A disk that filled up during training: safetensors says so with its own SafetensorError, not an
    OSError, and an epoch evaluation's best_model export let any error through. The run ended with a
    traceback at the first better evaluation (after the checkpoint's warning had said training goes on),
    and each failed export left its half-written temp folder on the full disk."""
    from safetensors import SafetensorError

    from vits_trainer.training.outputs import RunOutputs

    def disk_full(self, folder, *args, **kwargs):
        Path(folder).mkdir(parents=True, exist_ok=True)
        (Path(folder) / "model.safetensors").write_bytes(b"half")
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    def evaluate_every_epoch(self):
        self.run_eval(f"epoch {self.s.state.epoch}")
        self.save_checkpoint("epoch")

    monkeypatch.setattr(VitsModel, "save_pretrained", disk_full)
    monkeypatch.setattr(RunOutputs, "evaluate_and_save_if_due", evaluate_every_epoch)
    _, summary = train_tiny(tmp_path, tone_corpus, tiny_model_dir, max_steps=6)
    out = capsys.readouterr().out
    assert summary["steps"] == 6 and summary["final_model"] is None
    assert "warning: best model not updated (No space left on device)" in out, out[-3000:]
    assert summary["best_model"] is None and summary["best_model_not_exported"] == "No space left on device"
    last = tmp_path / "checkpoints" / "step_00000006"
    assert f"failed (No space left on device); the last good checkpoint is {last}" in out
    assert not list(tmp_path.glob(".final_model.tmp-*"))
    assert not list((tmp_path / "checkpoints").glob(".best_model.tmp-*"))


def test_disk_full_while_writing_an_evaluations_samples_keeps_training(
    tmp_path, tiny_model_dir, tone_corpus, monkeypatch, capsys
):
    """The sample WAVs an evaluation speaks, written to a full disk: the OSError ended the run with a
    traceback at its start evaluation (or mid-run, losing the steps since the last checkpoint)."""

    def disk_full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(outputs_module, "synthesize", disk_full)
    monkeypatch.setattr(outputs_module, "write_wavs", disk_full)  # the free-running pass's own takes
    _, summary = train_tiny(tmp_path, tone_corpus, tiny_model_dir, max_steps=2, eval_samples=1)
    out = capsys.readouterr().out
    assert summary["steps"] == 2 and summary["final_model"]
    assert "warning: samples of step 0 not written (No space left on device)" in out, out[-2000:]


def test_failed_final_export_with_no_checkpoint_saved_does_not_name_one(
    tmp_path, tiny_model_dir, tone_corpus, monkeypatch, capsys
):
    """Every save of a new run failed (a full disk), then the export: the error line named "the last good
    checkpoint is None", a checkpoint to resume from that does not exist."""

    def disk_full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(outputs_module, "write_checkpoint", disk_full)
    monkeypatch.setattr(outputs_module, "export_model", disk_full)
    _, summary = train_tiny(tmp_path, tone_corpus, tiny_model_dir, max_steps=2, save_minutes=0.001)
    out = capsys.readouterr().out
    assert summary["final_model"] is None and "is None" not in out, out[-2000:]
    assert "failed (No space left on device); no checkpoint of this run could be saved either" in out
    # a folder that holds the run's results refuses a new run: starting again means another folder
    assert "start it again with another --checkpoint_dir" in out
    # nor did the failed saves speak of a previous checkpoint that was never written
    assert "the previous one is intact" not in out
    assert (
        "checkpoint at step 1 failed (No space left on device); no checkpoint of this run is saved yet" in out
    )


def test_resume_falls_back_when_the_newest_checkpoint_is_damaged(
    tmp_path, tiny_model_dir, tone_corpus, capsys
):
    train_tiny(tmp_path, tone_corpus, tiny_model_dir, max_steps=6, save_minutes=0.001, keep_checkpoints=3)
    newest, previous = list_checkpoints(tmp_path / "checkpoints")[:2]
    weights = newest / "generator.safetensors"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte, same size
    weights.write_bytes(bytes(data))
    capsys.readouterr()
    cfg = tiny_config(tmp_path, tone_corpus, tiny_model_dir, max_steps=8)
    session = build_session(cfg, time.time())
    assert session.resumed_from == previous
    assert f"skipping damaged checkpoint {newest.name}" in capsys.readouterr().out
    session.run_lock.release()

    # every checkpoint damaged: refused, where a fresh run once started over the run's files
    for checkpoint in list_checkpoints(tmp_path / "checkpoints"):
        (checkpoint / "generator.safetensors").write_bytes(bytes(data))
    metrics = (tmp_path / "checkpoints" / "metrics.jsonl").read_bytes()
    with pytest.raises(UserError, match="no checkpoint in it is usable .*step_00000006.*damaged"):
        build_session(cfg, time.time())
    assert (tmp_path / "checkpoints" / "metrics.jsonl").read_bytes() == metrics


def test_interrupted_checkpoint_write_leaves_the_previous_one(tmp_path):
    good = write_checkpoint(tmp_path, 1, {"a.bin": b"1" * 100})

    class Boom(dict):
        def items(self):
            yield "a.bin", b"2" * 100
            raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(OSError):
        write_checkpoint(tmp_path, 2, Boom())
    assert list_checkpoints(tmp_path) == [good]
    assert not list(tmp_path.glob(".step_*"))


@pytest.mark.parametrize(
    "field, value",
    [
        ("files", []),
        ("files", None),
        ("files", {"a.bin": 3}),
        ("files", {"a.bin": {}}),
        ("files", {"a.bin": {"size": "100", "digest": "x"}}),
        ("step", None),
        ("step", "2"),
        ("created", None),
    ],
    ids=str,
)
def test_a_manifest_damaged_inside_is_skipped_like_any_damaged_checkpoint(tmp_path, field, value):
    # a manifest whose "files" was not a mapping of names to sizes and digests raised an AttributeError,
    # TypeError or KeyError: a traceback at resume (instead of falling back) and in the pruning after a
    # save; one without its step or time was taken as intact and failed when resuming read them
    good = write_checkpoint(tmp_path, 1, {"a.bin": b"1" * 100})
    newest = write_checkpoint(tmp_path, 2, {"a.bin": b"2" * 100})
    manifest = json.loads((newest / "manifest.json").read_text(encoding="utf-8"))
    manifest[field] = value
    (newest / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
    lines: list[str] = []
    assert find_resumable(tmp_path, log=lines.append)[0] == good
    assert len(lines) == 1 and lines[0].startswith("warning: skipping damaged checkpoint step_00000002")
    assert prune_checkpoints(tmp_path, keep=1) == [] and list_checkpoints(tmp_path) == [newest, good]


def test_a_run_that_raises_gives_its_folder_back(tmp_path, tiny_model_dir, tone_corpus, monkeypatch):
    """An error inside the loop (here a stand-in for a driver error) ends the run: its lock on
    --checkpoint_dir is released on the way out, so the next run in the same process (a notebook's next
    cell) is not refused "in use by another run" naming its own pid."""

    def broken_move(batch, device):
        raise RuntimeError("a driver error")

    monkeypatch.setattr(loop_module, "move_batch", broken_move)
    with pytest.raises(RuntimeError, match="a driver error"):
        train_tiny(tmp_path, tone_corpus, tiny_model_dir, max_steps=2)
    monkeypatch.undo()
    session = build_session(tiny_config(tmp_path, tone_corpus, tiny_model_dir, max_steps=2), time.time())
    session.run_lock.release()


def test_the_same_step_saved_twice_holds_the_second_save(tmp_path):
    """A signal right after a periodic save saves step N again: the new files replace the old ones, and
    the old folder is renamed aside (not deleted first, which left no step N while it was deleted)."""
    write_checkpoint(tmp_path, 5, {"a.bin": b"1" * 100})
    again = write_checkpoint(tmp_path, 5, {"a.bin": b"2" * 100})
    assert (again / "a.bin").read_bytes() == b"2" * 100 and list_checkpoints(tmp_path) == [again]
    assert not list(tmp_path.glob(".step_*"))  # the aside copy is gone


def test_unreadable_clip_after_preparation_is_skipped(tmp_path, tiny_model_dir, tone_corpus, capsys):
    data = tmp_path / "data"
    shutil.copytree(tone_corpus, data, ignore=shutil.ignore_patterns("cache"))
    (data / "wavs" / "clip00003.wav").write_bytes(b"not a wav at all")
    session, summary = train_tiny(tmp_path, data, tiny_model_dir, max_steps=2)
    out = capsys.readouterr().out
    assert out.count("could not be read") == 1  # one line, naming the clip
    assert "warning: 1 clip(s) could not be read and are skipped (clip00003: " in out
    assert summary["steps"] == 2
    assert "clip00003" not in session.data.train.ids()


@pytest.mark.slow
def test_sigkill_five_times_then_resume(tmp_path, tiny_model_dir, tone_corpus):
    """Killed at random moments (mid-step, mid-save, mid-eval...), each time resumed with --resume auto."""
    save_seconds = 3.0
    settings = cli_settings(
        tmp_path, tone_corpus, tiny_model_dir, save_minutes=save_seconds / 60, log_every=1
    )
    cmd = [PYTHON, str(ROOT / "train_vits.py"), *cli_args(settings)]
    metrics = tmp_path / "checkpoints" / "metrics.jsonl"
    rng = random.Random(7)
    kills = []  # (last step logged before the kill, steps logged in the last save interval + slack)
    resumed = []

    def resumed_step(output: str) -> int | None:
        lines = [x for x in output.splitlines() if x.startswith("resuming from step_")]
        return int(lines[0].split("(step ")[1].split(")")[0]) if lines else None

    for i in range(5):
        proc = subprocess.Popen(
            [*cmd, "--target_hours", str(600 / 3600)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        start = time.monotonic()
        previous = max([r["step"] for r in _records(metrics) if "loss_g" in r] or [0])
        # a first checkpoint too before the first kill: on a busy machine 3 steps and 2 s could come
        # before it, and the first resume then started afresh (resumed [None, 10, 16, 23, 30])
        while time.monotonic() - start < 120 and not (
            _steps_since(metrics, previous) and list((tmp_path / "checkpoints").glob("step_*"))
        ):
            time.sleep(0.2)
        time.sleep(rng.uniform(0.0, 6.0))  # anywhere: mid-step, mid-save, mid-eval, mid-export
        killed_at = time.time()
        proc.send_signal(signal.SIGKILL)
        output, _ = proc.communicate(timeout=30)
        if i > 0:
            resumed.append(resumed_step(output))
        steps = [r for r in _records(metrics) if "loss_g" in r]
        recent = [r for r in steps if r["time"] >= killed_at - save_seconds - 2.0]
        kills.append((max(r["step"] for r in steps), len(recent) + 1))
    # the last resume ends after a few steps, with a budget that leaves a loaded machine time for them
    # (a 40 s budget made no step beside other heavy processes)
    final = subprocess.run(
        [*cmd, "--target_hours", str(120 / 3600), "--max_steps", str(kills[-1][0] + 3)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert final.returncode == 0, final.stdout[-2000:] + final.stderr[-2000:]
    resumed.append(resumed_step(final.stdout))
    summary = json.loads((tmp_path / "final_model" / "train_summary.json").read_text())
    assert summary["resumed_from_step"] == resumed[-1]
    assert len(resumed) == 5 and all(r is not None and r > 0 for r in resumed), resumed
    # every resume comes from a checkpoint at most one save interval behind the kill, never ahead of it
    for (last_logged, allowed), step in zip(kills, resumed, strict=True):
        assert last_logged - allowed <= step <= last_logged, (kills, resumed)
    assert resumed == sorted(resumed)  # the step count never goes backwards
    assert summary["steps"] > resumed[-1]
    VitsModel.from_pretrained(tmp_path / "final_model")
    assert not list((tmp_path / "checkpoints").glob(".step_*.tmp-*"))


def _records(path: Path) -> list[dict]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            pass  # a line cut by the kill
    return out


def _steps_since(path: Path, step: int) -> bool:
    return any(r.get("step", 0) > step + 2 for r in _records(path) if "loss_g" in r)


def test_too_little_disk_space_is_refused_up_front(tmp_path, tiny_model_dir, tone_corpus, monkeypatch):
    """A disk that cannot hold two checkpoints and the exports (simulated: the free space is patched)."""
    import collections

    import vits_trainer.training.session as session_module

    usage = collections.namedtuple("usage", "total used free")
    monkeypatch.setattr(session_module.shutil, "disk_usage", lambda path: usage(10**9, 10**9 - 1000, 1000))
    cfg = tiny_config(tmp_path, tone_corpus, tiny_model_dir, max_steps=1)
    with pytest.raises(UserError, match="not enough disk space"):
        build_session(cfg, time.time())
    # another process of `accelerate launch` refuses it too: it waited for the exited main process in
    # make_accelerator until the launcher killed it, 30 s later
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")

    def make_accelerator(*args):
        raise AssertionError("the processes connect before the check")

    monkeypatch.setattr(session_module, "make_accelerator", make_accelerator)
    with pytest.raises(UserError, match="not enough disk space"):
        build_session(cfg, time.time())


def test_resuming_an_older_checkpoint_sets_the_later_ones_aside_and_keeps_a_better_best_model(
    tmp_path, tiny_model_dir, tone_corpus, capsys
):
    """Going back to an older checkpoint starts another future. The checkpoints of the one left move to
    abandoned/ (kept): without that, keeping the newest pruned the resumed one, and the next plain
    resume went back to the future the user left. Its best_model/, which scored better than anything the
    older checkpoint knows, stays the best to beat: it was replaced by the resumed run's first, worse,
    evaluation."""
    from vits_trainer.safety import marker_step, read_marker
    from vits_trainer.training.checkpoint import list_checkpoints

    _, first = train_tiny(tmp_path, tone_corpus, tiny_model_dir, max_steps=8, save_minutes=1e-4)
    ckpts = tmp_path / "checkpoints"
    kept = list_checkpoints(ckpts)
    assert len(kept) >= 2 and kept[0].name == "step_00000008", kept
    best = ckpts / "best_model"
    best_step = marker_step(read_marker(best))
    assert best_step == 8, first  # the final evaluation beat the start's
    # the left future's best scored far better than anything the older checkpoint knows
    metrics = ckpts / "metrics.jsonl"
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    for r in records:
        if r.get("event") == "eval" and r.get("step") == best_step:
            r["val_mel"] = 1e-3
    metrics.write_text("".join(json.dumps(r) + "\n" for r in records))
    older = kept[-1]
    capsys.readouterr()

    session, summary = train_tiny(
        tmp_path, tone_corpus, tiny_model_dir, max_steps=int(older.name[5:]) + 3, resume=str(older)
    )
    out = capsys.readouterr().out
    left = [p.name for p in kept if p != older]
    assert sorted(p.name for p in (ckpts / "abandoned").iterdir()) == sorted(left)
    assert f"moved to {ckpts / 'abandoned'} (kept)" in out
    assert list_checkpoints(ckpts)[0].name == f"step_{int(older.name[5:]) + 3:08d}"  # what auto resumes
    assert "best_model: keeps the weights of step 8 (val_mel 0.0010)" in out
    assert marker_step(read_marker(best)) == 8 and summary["best_step"] == 8


def test_resuming_a_set_aside_checkpoint_sets_aside_the_later_ones_again(tmp_path):
    """Going back to a checkpoint in abandoned/ is going back too: the later checkpoints of the folder
    move aside (a name taken there gets a suffix), or --resume auto would take the newest of them."""
    from vits_trainer.training.carry import set_aside_later_checkpoints
    from vits_trainer.training.checkpoint import list_checkpoints

    folder = tmp_path / "checkpoints"
    for name in (
        "step_00000054",
        "step_00000100",
        "step_00000109",
        "abandoned/step_00000063",
        "abandoned/step_00000100",
    ):
        (folder / name).mkdir(parents=True)
    lines = []
    set_aside_later_checkpoints(folder, folder / "abandoned" / "step_00000063", 63, lines.append)
    assert [p.name for p in list_checkpoints(folder)] == ["step_00000054"]
    assert sorted(p.name for p in (folder / "abandoned").iterdir()) == [
        "step_00000063",
        "step_00000100",
        "step_00000100-2",
        "step_00000109",
    ]
    assert lines == [
        f"resume: from step 63, an older checkpoint: the later step_00000100, step_00000109 moved to "
        f"{folder / 'abandoned'} (kept); --resume auto continues from here"
    ]
    # a checkpoint of another folder (carried over) sets nothing aside
    set_aside_later_checkpoints(folder, tmp_path / "elsewhere" / "step_00000001", 1, lines.append)
    assert [p.name for p in list_checkpoints(folder)] == ["step_00000054"] and len(lines) == 1
