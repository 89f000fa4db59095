"""One VITS training step under `accelerate`: a discriminator block, then a generator block.

Order and bookkeeping, and why:
- D is trained on detached fakes; its gradients are cleared right before its first backward of an
  accumulation cycle, so nothing from an earlier generator pass can leak into its update.
- The generator's adversarial pass runs through the unwrapped D with D's parameters frozen
  (`requires_grad_(False)`): gradients reach the fake waveform but are never written into D.
- Both optimisers step together at the end of the cycle, after one finiteness check of every loss
  and both gradient norms: a non-finite step is skipped for BOTH networks (no weights touched).
  This is why D steps after the generator's backward (its adversarial terms therefore see D from
  before this step's update; the gradients are the same ones VITS would compute otherwise).
- D runs once over [real; fake] and once over the fakes: with D's weights unchanged between the two,
  its features of the real segments in the first pass are feature matching's targets, and a
  second pass over them (a quarter of D's forward work, and its backward) would recompute them.
- Gradient accumulation is driven by the loop: each `micro_step` call says whether it is the cycle's
  first micro-batch (clear the gradients), its last (step the optimisers) and its share of the cycle,
  so a cycle can end early at an epoch boundary and the micro-batch can shrink after an out-of-memory
  error; DDP gradient sync is suppressed with `accelerator.no_sync` on all but a cycle's last one.
- One GradScaler (`accelerator.scaler`, fp16) serves both optimisers: unscale both, check, step both,
  update once. `AcceleratedOptimizer.step` would call `update()` after each optimiser, so accelerate
  never wraps the optimisers (session.py's `_prepare` gives it the networks alone): they are plain
  torch optimisers, stepped here through the scaler.
- Losses and spectrograms are float32 (autocast covers only the networks).
- `use_compiled(True, scope=...)` runs the parts of a compile scope compiled (model/compiled.py; by
  default the decoder on segments and both discriminator passes); whether that pays, and which scope,
  is decided by the loop (compile_choice.py).
- With CUDA graphs the gradients go into buffers that live from step to step (`stable_grads`):
  cleared to zero, never to None. A parameter whose `.grad` is None takes the backward's output tensor
  itself, and a CUDA graph's outputs are overwritten by its next replay: the next micro-batch of the
  cycle would overwrite the gradient it adds to, and accumulate wrong gradients without an error
  (pytorch/pytorch#96693). Eager steps set them to None (less memory between steps).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field

import torch

from ..model.compiled import SCOPE, compile_mode, compiled, compiled_parts, mark_step_begin
from ..model.losses import (
    LossWeights,
    discriminator_loss,
    feature_matching_loss,
    generator_adversarial_loss,
    generator_total,
)
from ..profiling import NO_TIMER


def make_optimizer(params, lr: float, weight_decay: float = 0.01) -> torch.optim.AdamW:
    """AdamW as VITS trains it: betas (0.8, 0.99), eps 1e-9.

    Fused (one kernel for every parameter) where torch has the fused kernel for the parameters'
    device and dtype, as on CPU and CUDA in float32; else the foreach path. The default per-tensor
    loop on CPU dispatches ~11 operators per parameter tensor (4625 per step on the tiny model).
    """
    params = [p for p in params if p.requires_grad]
    try:  # a private helper: should a torch release drop it, the foreach path is the fallback
        from torch.optim.optimizer import _get_fused_kernels_supported_devices

        devices = _get_fused_kernels_supported_devices()
    except ImportError:
        devices = []
    fused = bool(params) and all(p.device.type in devices and p.is_floating_point() for p in params)
    return torch.optim.AdamW(
        params,
        lr=lr,
        betas=(0.8, 0.99),
        eps=1e-9,
        weight_decay=weight_decay,
        fused=True if fused else None,
        foreach=None if fused else True,
    )


def clip_grad_norm(params: list[torch.Tensor], max_norm: float) -> torch.Tensor:
    """`torch.nn.utils.clip_grad_norm_` (L2, same formula) for parameters on one device, in a fixed
    handful of operators: torch's own moves each tensor's norm to the first device one by one, one
    operator per parameter tensor (~950 per step at MMS size) even when they are all on one device."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return torch.zeros(())
    total = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
    torch._foreach_mul_(grads, torch.clamp(max_norm / (total + 1e-6), max=1.0))
    return total


@dataclass
class StepResult:
    synced: bool  # end of an accumulation cycle: the optimisers were asked to step
    skipped: bool = False  # non-finite losses or gradients: neither network was updated
    # fp16 only: the losses were finite but the scaled gradients overflowed, i.e. the loss scale was
    # too high; the scaler lowers it (scale_before -> scale_after), which is its normal calibration
    overflow: bool = False
    scale_before: float | None = None
    scale_after: float | None = None
    metrics: dict[str, torch.Tensor] = field(default_factory=dict)  # detached, on the device
    # seconds the host waited at the step's one read for the work queued on the device before it: on a
    # GPU, time the GPU computed while the host had nothing left to launch (on a CPU ~0: nothing queues)
    device_wait: float = 0.0


class GanStep:
    """Drives generator + discriminator for one micro-batch of an accumulation cycle."""

    def __init__(
        self,
        accelerator,
        generator,
        discriminator,
        g_optimizer: torch.optim.Optimizer,
        d_optimizer: torch.optim.Optimizer,
        weights: LossWeights | None = None,
        max_grad_norm: float = 10.0,
        log=print,
    ):
        self.accelerator = accelerator
        # as accelerate prepared them (a DDP wrapper in a multi-process run), and the modules inside: the
        # same names as the session's
        self.generator = generator
        self.discriminator = discriminator
        self.generator_raw = accelerator.unwrap_model(generator)
        self.discriminator_raw = accelerator.unwrap_model(discriminator)
        self.g_optimizer = g_optimizer
        self.d_optimizer = d_optimizer
        self.weights = weights or LossWeights()
        self.max_grad_norm = max_grad_norm
        self.log = log  # a compiled part that goes back to eager says so here
        self.g_params = [p for group in g_optimizer.param_groups for p in group["params"]]
        self.d_params = [p for group in d_optimizer.param_groups for p in group["params"]]
        self.timer = NO_TIMER  # a SectionTimer in the benchmarks (also set on the generator)
        self.compiled_disc = None  # the discriminator compiled (use_compiled), else None: eager
        self.compiled_made: dict = {}  # every part compiled so far, kept while the step is compiled
        self.stable_grads = False  # gradients cleared to zero, not None (CUDA graphs: module docstring)

    def use_compiled(self, on: bool, backend: str | None = None, scope: str = SCOPE) -> None:
        """Run the networks of `scope` compiled (model/compiled.py; by default the decoder on segments
        and both discriminator passes), or eager again. Going to another scope compiles only the parts
        not compiled before. One process only: under DDP the discriminator's pass must go through its
        wrapper."""
        generator = self.generator_raw
        if not on:
            self.compiled_disc = None
            self.compiled_made = {}
            self.stable_grads = False
            generator.compiled.clear()
            return
        if self.accelerator.num_processes > 1:
            raise ValueError("a compiled step runs in a single process")
        device_type = self.accelerator.device.type
        self.stable_grads = compile_mode(device_type) == "reduce-overhead"
        parts = compiled_parts(generator.model, device_type, backend, scope, self.log, self.compiled_made)
        if self.compiled_disc is None:
            self.compiled_disc = compiled(self.discriminator_raw, device_type, backend)
        generator.compiled.clear()
        generator.compiled.update(parts)

    def _no_sync(self, sync: bool):
        if sync or self.accelerator.num_processes == 1:
            return contextlib.nullcontext()
        stack = contextlib.ExitStack()
        stack.enter_context(self.accelerator.no_sync(self.generator))
        stack.enter_context(self.accelerator.no_sync(self.discriminator))
        return stack

    def __call__(
        self,
        batch: dict[str, torch.Tensor],
        micro_index: int = 0,
        cycle_length: int = 1,
        cycle_clips: int | None = None,
    ) -> StepResult:
        """Micro-batch `micro_index` of a cycle of `cycle_length`; the optimisers step after the last one.
        `cycle_clips`: the cycle's clips, when its micro-batches differ in size (else each weighs
        1 / `cycle_length`). (Tests and benchmarks call this; the loop calls `micro_step`.)"""
        clips = batch["input_ids"].size(0)
        scale = clips / cycle_clips if cycle_clips else 1.0 / cycle_length
        return self.micro_step(batch, micro_index == 0, micro_index == cycle_length - 1, scale)

    def micro_step(self, batch: dict[str, torch.Tensor], first: bool, last: bool, scale: float) -> StepResult:
        """One micro-batch: `first` clears the gradients, `last` steps the optimisers, `scale` weights
        this micro-batch's losses within the cycle: its share of the cycle's clips, as its losses are
        means over its own clips."""
        acc = self.accelerator
        if self.compiled_disc is not None:
            mark_step_begin(acc.device.type)
        d_pass = self.discriminator if self.compiled_disc is None else self.compiled_disc
        g_pass = self.discriminator_raw if self.compiled_disc is None else self.compiled_disc
        with self._no_sync(last):
            with acc.autocast():
                out = self.generator(
                    batch["input_ids"],
                    batch["attention_mask"],
                    batch["audio"],
                    batch["audio_lengths"],
                    batch.get("speaker_ids"),
                    spectrogram=batch.get("spectrogram"),
                )
            real, fake = out.waveform_real, out.waveform_fake

            # --- discriminator: real vs detached fake, one pass over both halves -----------------
            timer = self.timer
            with timer("discriminator"), acc.autocast():
                logits, features = d_pass(torch.cat([real, fake.detach()], dim=0))
            n = real.size(0)
            loss_d = discriminator_loss(logits, n)
            # feature matching's targets: D's weights are the same in the generator's pass (both
            # optimisers step at the end of the cycle), so that pass runs on the fakes alone
            real_features = [[m[:n] for m in maps] for maps in features]  # no gradient: the loss
            del logits, features
            if first:
                self._clear_grads(self.d_optimizer, self.d_params)
            with timer("backward"):
                acc.backward(loss_d * scale)

            # --- generator: adversarial + feature matching through a frozen D --------------------
            self.discriminator_raw.requires_grad_(False)
            try:
                with timer("discriminator"), acc.autocast():
                    logits, features = g_pass(fake)
            finally:
                self.discriminator_raw.requires_grad_(True)
            # what the generator trains on (generator_total reads losses.LOSS_KEYS, weighted by
            # LossWeights); every entry is also logged, a key outside LOSS_KEYS only logged
            losses = {
                "mel": out.mel,
                "kl": out.kl,
                "duration": out.duration,
                "adversarial": generator_adversarial_loss(logits),
                "feature_matching": feature_matching_loss(real_features, features),
            }
            loss_g = generator_total(losses, self.weights)
            if first:
                self._clear_grads(self.g_optimizer, self.g_params)
            with timer("backward"):
                acc.backward(loss_g * scale)

            metrics = {k: v.detach() for k, v in losses.items()}
            metrics["loss_g"] = loss_g.detach()
            metrics["loss_d"] = loss_d.detach()
        if not last:
            return StepResult(synced=False, metrics=metrics)
        with self.timer("optimizer"):
            return self._optimizer_step(metrics)

    def _optimizer_step(self, metrics: dict[str, torch.Tensor]) -> StepResult:
        scaler = self.accelerator.scaler
        if scaler is not None:
            scaler.unscale_(self.d_optimizer)
            scaler.unscale_(self.g_optimizer)
        # clipping before the finiteness check is harmless (a non-finite step's gradients are dropped) and
        # its total norm is the one the check needs
        norm_d = clip_grad_norm(self.d_params, self.max_grad_norm)
        norm_g = clip_grad_norm(self.g_params, self.max_grad_norm)
        metrics["grad_norm_d"], metrics["grad_norm_g"] = norm_d, norm_g
        checks = torch.stack(
            [
                metrics["loss_g"].float(),
                metrics["loss_d"].float(),
                norm_d.to(metrics["loss_g"].device),
                norm_g.to(metrics["loss_g"].device),
            ]
        )
        flags = torch.isfinite(checks).to(torch.float32)
        if self.accelerator.num_processes > 1:  # one rank's NaN loss skips the step on every rank
            torch.distributed.all_reduce(flags, op=torch.distributed.ReduceOp.MIN)
        waited = time.perf_counter()
        loss_g_ok, loss_d_ok, norm_d_ok, norm_g_ok = (x > 0 for x in self._read(flags))
        device_wait = time.perf_counter() - waited
        finite = loss_g_ok and loss_d_ok and norm_d_ok and norm_g_ok
        # the scale is read only for a skipped step: nothing else is queued on the device then, while
        # after a real step reading it would wait for the optimisers' kernels
        overflow = scaler is not None and not finite
        scale_before = scaler.get_scale() if overflow else None
        if finite:
            if scaler is not None:
                scaler.step(self.d_optimizer)
                scaler.step(self.g_optimizer)
            else:
                self.d_optimizer.step()
                self.g_optimizer.step()
        if scaler is not None:
            scaler.update()  # lowers the scale after an overflow, raises it after a calm stretch
        scale_after = scaler.get_scale() if overflow else None
        self.abandon_cycle()
        return StepResult(
            synced=True,
            skipped=not finite,
            overflow=overflow and loss_g_ok and loss_d_ok,
            scale_before=scale_before,
            scale_after=scale_after,
            metrics=metrics,
            device_wait=device_wait,
        )

    @staticmethod
    def _read(flags: torch.Tensor) -> list[float]:
        """The step's one host read (the finiteness flags): on a GPU it waits for every kernel queued
        before it."""
        return flags.tolist()

    def abandon_cycle(self) -> None:
        """Drop the gradients of the current cycle (after a step, or before retrying one): set to None,
        their memory free until the next backward. Kept buffers (`stable_grads`) are left as they are:
        the next cycle's first micro-batch zeroes them before its backward, and zeroing them here too was
        a second pass over every gradient at each step."""
        if self.stable_grads:
            return
        self._clear_grads(self.d_optimizer, self.d_params)
        self._clear_grads(self.g_optimizer, self.g_params)

    def _clear_grads(self, optimizer: torch.optim.Optimizer, params: list[torch.Tensor]) -> None:
        """None, or zero in buffers made outside any CUDA graph (`stable_grads`, module docstring)."""
        if not self.stable_grads:
            optimizer.zero_grad(set_to_none=True)
            return
        for p in params:
            if p.requires_grad and p.grad is None:
                p.grad = torch.zeros_like(p)
        optimizer.zero_grad(set_to_none=False)
