"""Self-repair when training goes numerically wrong (`Recovery`, one part of loop.Trainer).

Non-finite steps are skipped by the step itself (no weights touched). After `--max_consecutive_skips`
of them in a row the run is stuck in a bad region: `Recovery` reloads the last good weights (the newest
checkpoint whose weights trained a finite step, else the weights the run started from), halves the
learning rate and moves one rung down the precisions fp16 -> bf16 (where supported) -> fp32, and says so
in one line. A checkpoint saved after the last finite step is passed over: the step before it may be the
one that broke the weights (finite losses, weights that give NaN from then on: --learning_rate 1), and
reloading it would only be stuck again, recovery after recovery, to the end of the budget.

An out-of-memory error inside a step is not handled here: `Trainer.step_with_retries` redoes the cycle
with the smaller micro-batch that `MicroBatchPolicy.smaller_after_oom` (microbatch_choice.py) chooses.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from ..model.discriminator import VitsDiscriminator
from .checkpoint import CheckpointError, verify_checkpoint
from .checkpoint_names import list_checkpoints, step_of
from .runtime import native_bf16
from .trainstate import LoadedCheckpoint


def switch_precision(accelerator, modules: list[torch.nn.Module], target: str) -> None:
    """Change the autocast dtype of a prepared run in place ("bf16" or "no"); drops the fp16 scaler.

    accelerate fixes the precision when it prepares a model (it wraps `forward` in an autocast of that
    dtype), so the wrapper is removed here; the step and the evaluation open `accelerator.autocast()`
    themselves, which follows the new setting.
    """
    accelerator.state._mixed_precision = target
    accelerator.native_amp = target != "no"
    accelerator.scaler = None
    for module in modules:
        if "_original_forward" in module.__dict__:
            # the instance attribute is the wrapper; without it the class's own forward is used again
            module.__dict__.pop("_original_forward")
            module.__dict__.pop("forward", None)


def next_precision(current: str) -> str | None:
    """Where to go after repeated non-finite steps: fp16 -> bf16 (if the GPU has it) -> fp32."""
    if current == "fp16":
        if torch.cuda.is_available() and native_bf16():
            return "bf16"
        return "no"
    if current == "bf16":
        return "no"
    return None


def restore_weights(
    model: torch.nn.Module,
    discriminator: VitsDiscriminator,
    generator_state: dict[str, torch.Tensor],
    discriminator_state: dict[str, torch.Tensor],
) -> None:
    with torch.no_grad():
        model.load_state_dict(generator_state, strict=True)
        discriminator.load_state_dict(discriminator_state, strict=True)


# fp16 gradient overflows while the loss scale is at least this are the scaler's own calibration; below
# it the gradients overflow fp16 even unscaled, which counts toward a recovery (out of fp16)
MIN_CALIBRATION_SCALE = 2.0**-4


class Recovery:
    """Skipped steps and the recovery of a run (one part of loop.Trainer). Owns the weights the run
    started from (`initial_weights`, CPU copies): what a recovery falls back to before the first
    checkpoint exists. `last_checkpoint()` is the newest complete checkpoint."""

    def __init__(self, session, metrics, last_checkpoint: Callable[[], Path | None]) -> None:
        self.s = session
        self.metrics = metrics
        self.last_checkpoint = last_checkpoint
        self.initial_weights = (
            {k: v.detach().cpu().clone() for k, v in session.model.state_dict().items()},
            {k: v.detach().cpu().clone() for k, v in session.discriminator_raw.state_dict().items()},
        )

    def after_step(self, result, pending: list[dict]) -> None:
        """Count skipped (non-finite) steps; after too many in a row, recover."""
        s = self.s
        if not result.skipped:
            s.state.consecutive_skips = 0
            # the weights of every checkpoint up to the one before this step trained a finite step
            s.state.last_finite_step = s.budget.global_step
            return
        s.state.skipped_steps += 1
        train = s.data.train  # the skipped step's clips, named in the log
        ids = [train.clip_id(int(i)) for x in pending for i in x["indices"].tolist()]
        step = s.budget.global_step
        if result.overflow and result.scale_before >= MIN_CALIBRATION_SCALE:
            # fp16's loss scale was too high for these gradients: the scaler lowers it and the next
            # step retries, which is how GradScaler works, not a fault (no recovery counted)
            s.log(
                f"fp16: gradients overflowed at step {step}, loss scale {result.scale_before:g} -> "
                f"{result.scale_after:g}; step skipped (no weights changed)"
            )
            self.metrics.write({"event": "overflow", "step": step, "scale": result.scale_after, "clips": ids})
            return
        s.state.consecutive_skips += 1
        s.log(
            f"warning: step {step} skipped (non-finite loss or gradient; no weights changed), "
            f"clips: {', '.join(ids[:8])}{' ...' if len(ids) > 8 else ''}"
        )
        self.metrics.write({"event": "skipped", "step": step, "clips": ids})
        if s.state.consecutive_skips >= s.cfg.max_consecutive_skips:
            self.recover()

    def candidates(self) -> list[Path]:
        """The checkpoints a recovery may reload, newest first: those whose weights trained a finite step
        after them (saved before `last_finite_step`). The newest is the one this run wrote last; older
        ones are the kept ones still in its folder."""
        newest = self.last_checkpoint()
        if newest is None:
            return []
        found = [newest, *(p for p in list_checkpoints(newest.parent) if p != newest)]
        return [p for p in found if (step_of(p.name) or 0) < self.s.state.last_finite_step]

    def recover(self) -> None:
        """Reload the last good weights, halve the LR, one precision down (fp16 -> bf16 -> fp32); one line
        says what happened."""
        s = self.s
        count = s.state.consecutive_skips
        parts = None
        newest = self.last_checkpoint()
        candidates = self.candidates()
        for candidate in candidates:
            try:  # read every part first: a damaged one must not leave the weights half restored
                ckpt = LoadedCheckpoint(candidate, verify_checkpoint(candidate))
                parts = [
                    ckpt.tensors("generator.safetensors"),
                    ckpt.tensors("discriminator.safetensors"),
                    ckpt.object("optimizer_g.pt"),
                    ckpt.object("optimizer_d.pt"),
                ]
                last_checkpoint = candidate
                break
            except CheckpointError as err:  # an older one, else the starting weights, and says so
                s.log(f"warning: recovery cannot reload {candidate}: {err}")
                self.metrics.write(
                    {
                        "event": "damaged_checkpoint",
                        "step": s.budget.global_step,
                        "path": str(candidate),
                    }
                )
        if parts is not None:
            restore_weights(s.model, s.discriminator_raw, parts[0], parts[1])
            s.g_optimizer.load_state_dict(parts[2])
            s.d_optimizer.load_state_dict(parts[3])
            source = f"checkpoint {last_checkpoint.name}"
        else:
            restore_weights(s.model, s.discriminator_raw, *self.initial_weights)
            s.g_optimizer.state.clear()
            s.d_optimizer.state.clear()
            source = "the starting weights"
        if newest is not None and newest not in candidates:
            # said, so that a user who sees an older step reloaded knows why
            source += f" (not {newest.name}: no finite step since it was saved)"
        s.state.lr_scale *= 0.5
        s.apply_peak_lr()
        old = s.accelerator.mixed_precision
        new = next_precision(old)
        if new is not None:
            switch_precision(s.accelerator, [s.generator_raw, s.discriminator_raw], new)
            s.state.precision = new
        s.state.recoveries += 1
        s.state.consecutive_skips = 0
        precision = f", precision {old} -> {new}" if new else ""
        s.log(
            f"recovery: {count} non-finite steps in a row; reloaded {source}, learning rate halved "
            f"(x{s.state.lr_scale:g} of --learning_rate){precision}"
        )
        self.metrics.write(
            {
                "event": "recovery",
                "step": s.budget.global_step,
                "source": source,
                "lr_scale": s.state.lr_scale,
                "precision": s.accelerator.mixed_precision,
            }
        )
