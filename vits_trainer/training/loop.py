"""The training loop shared by train_vits.py and train_feedback.py.

One optimiser step = `gradient_accumulation_steps` loader batches (fewer at the end of an epoch), run as
micro-batches of the size the micro-batch trial chose (microbatch.py): the same clips per step whatever
the size.
After each step the budget is told how long it took; once the benchmark samples are measured the
run is planned, and from then on it re-plans each epoch and stops at the last step boundary after
which the final evaluation, checkpoint and export still fit before the deadline. Evaluations and
checkpoints in between happen at epoch ends (skipped when they would cost more than ~10 % of the
training time or no longer fit) and every --save_minutes. SIGINT/SIGTERM end the run the same way,
minus the final evaluation: finish the step, save, export, exit 0.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import time
from pathlib import Path

import numpy as np
import torch

from ..data.metadata import SPLIT_FILE
from ..errors import UserError
from ..model.alignment import maximum_path
from ..model.discriminator import save_discriminator
from ..model.vits import export_model
from ..safety import UnsafeOverwrite, check_replaceable, replace_export, write_export_file, write_marker
from .checkpoint import (
    CheckpointError,
    checkpoint_name,
    prune_checkpoints,
    verify_checkpoint,
    write_checkpoint,
)
from .cpushare import cpu_share
from .evaluate import evaluate, move_batch, synthesize
from .freerun import dtw_scores, free_running_eval, write_wavs
from .microbatch import (
    TRIAL_SHARE,
    TRIAL_STEPS,
    TRIAL_STEPS_SHORT,
    MicroBatchTrial,
    accumulation_for,
    candidates,
    hardware_id,
    micro_batches,
    per_process_batch,
)
from .pictures import alignment_paths, log_images_to_trackers, warm_up_pictures, write_pictures
from .recovery import (
    free_memory,
    is_out_of_memory,
    next_precision,
    restore_weights,
    switch_precision,
)
from .reporting import MetricsLog, Progress, log_audio_to_trackers, plot_losses
from .runtime import describe_threads, git_revision, thread_report
from .session import Session, apply_lr_scale
from .step import GanStep
from .trainstate import LoadedCheckpoint, checkpoint_files

# fp16 gradient overflows while the loss scale is at least this are the scaler's own calibration; below
# it the gradients overflow fp16 even unscaled, which counts toward a recovery (out of fp16)
MIN_CALIBRATION_SCALE = 2.0**-4
OVERHEAD_SHARE = 0.1  # epoch-end evals/saves are skipped when they would exceed this share of the time
# Before the first step the budget needs a step time: one training sample costs about what one validation
# clip does (the eval decodes whole clips, training a segment but with backward passes and the
# discriminator: the same order). Crude, but it only decides whether a first step can still fit.
STEP_SECONDS_PER_EVAL_CLIP_SECONDS = 1.0


def gan_step(session: Session) -> GanStep:
    """The GAN step for a built session (its networks, optimisers, loss weights and clipping)."""
    s, cfg = session, session.cfg
    return GanStep(
        s.accelerator,
        s.generator,
        s.discriminator,
        s.g_optimizer,
        s.d_optimizer,
        cfg.loss_weights(),
        cfg.max_grad_norm,
    )


class SignalStop:
    """First SIGINT/SIGTERM: finish the step, save, exit 0. Second: exit at once."""

    def __init__(self, log):
        self.log = log
        self.received: str | None = None
        self._previous = {}
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                self._previous[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread (e.g. called from a notebook worker)
                pass

    def _handle(self, signum, frame):
        name = signal.Signals(signum).name
        if self.received is not None:
            self.log(f"{name} again: exiting now without saving")
            os._exit(128 + signum)
        self.received = name
        self.log(f"{name} received: finishing this step, then saving (send it again to exit at once)")

    def restore(self):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


class Trainer:
    def __init__(self, session: Session):
        self.s = session
        cfg = session.cfg
        self.metrics = MetricsLog(session.checkpoint_dir / "metrics.jsonl", session.is_main)
        self.step_fn = gan_step(session)
        self.accumulation = cfg.gradient_accumulation_steps  # loader batches per optimiser step
        self.step_clips = per_process_batch(cfg)  # clips per optimiser step, per process
        self.trial: MicroBatchTrial | None = None  # the micro-batch trial while it runs
        self.trial_steps: list[tuple[int, float, int, bool]] = []  # (size, seconds, samples, clean)
        self.last_micro: int | None = None  # the micro-batch size the last step ran at
        self.last_eval = self.last_save = time.time()
        self.data_wait = 0.0
        self.train_seconds = 0.0
        self.resumed_from_step = session.budget.global_step if session.resumed_from else None
        self.last_checkpoint: Path | None = session.resumed_from
        self.last_val: dict | None = None
        self.last_val_step: int | None = None
        self.final_eval_skipped: str | None = None  # why the final evaluation did not run
        self.budget_stop: dict | None = None  # what the budget weighed when it ended the run
        self.threads = thread_report()
        pinned = "OMP_NUM_THREADS" in (self.threads.get("set_by_user") or "")
        self.cpu_share = cpu_share(self.threads["torch_threads"], pinned)  # follows the machine's load
        self.threads["adaptive"] = self.cpu_share is not None
        self.warmup_reported: str | None = None
        # what a recovery falls back to before the first checkpoint exists (CPU copies)
        self.initial_weights = (
            {k: v.detach().cpu().clone() for k, v in session.model.state_dict().items()},
            {k: v.detach().cpu().clone() for k, v in session.discriminator_raw.state_dict().items()},
        )

    # ---- helpers --------------------------------------------------------------------------------

    def stop_decision(self, signals: SignalStop, want_save: bool = False) -> tuple[str | None, bool]:
        """(stop reason, save now?) as the main process sees them (its clock, its signals), the same on
        every rank; in multi-process runs rank 0's LR progress travels along."""
        s = self.s
        code = 0
        if s.is_main:
            if signals.received:
                code = 2
            elif s.budget.should_stop():
                code = 1
                self.budget_stop = s.budget.stop_state()
            elif s.cfg.max_steps and s.budget.global_step >= s.cfg.max_steps:
                code = 3
        if s.accelerator.num_processes > 1:
            from accelerate.utils import broadcast

            packet = torch.tensor([code, float(want_save), s.budget.lr_progress()], device=s.device)
            code, save, progress = broadcast(packet, from_process=0).tolist()
            code, want_save = int(code), bool(save)
            s.budget.share_progress(progress)
        return {0: None, 1: "budget", 2: "signal", 3: "max_steps"}[code], want_save

    def agree(self, flag: bool) -> bool:
        """The main process's yes/no on every rank (decisions that lead to collective operations)."""
        return bool(self.shared_int(int(flag)))

    def shared_int(self, value: int) -> int:
        """The main process's integer on every rank."""
        s = self.s
        if s.accelerator.num_processes == 1:
            return value
        from accelerate.utils import broadcast

        return int(broadcast(torch.tensor([float(value)], device=s.device), from_process=0).item())

    def clip_ids(self, indices: list[torch.Tensor]) -> list[str]:
        train = self.s.data.train
        return [train.clip_id(int(i)) for t in indices for i in t.tolist()]

    # ---- evaluation, checkpoints, export ---------------------------------------------------------

    def run_eval(self, tag: str, export_best: bool = True) -> dict:
        s = self.s
        t0 = time.perf_counter()
        results = {}
        for name, loader in s.val_loaders.items():
            values = evaluate(
                s.generator_raw, loader, s.device, s.accelerator.autocast, weights=s.cfg.loss_weights()
            )
            prefix = "" if name == "val" else f"{name}_"
            results.update({prefix + k: v for k, v in values.items()})
        freerun, spoken = free_running_eval(s)  # spoken from text alone, scored against the recordings
        results.update(freerun)
        step = s.budget.global_step
        primary = next(iter(s.val_loaders))
        metric = s.cfg.best_metric
        primary_mel = results.get(metric if primary == "val" else f"{primary}_{metric}")
        improved = primary_mel is not None and (s.state.best_val is None or primary_mel < s.state.best_val)
        record = {
            "event": "eval",
            "tag": tag,
            "step": step,
            "epoch": s.state.epoch,
            "time": time.time(),
            "seconds": round(time.perf_counter() - t0, 2),  # the evaluation itself (no samples written)
            **results,
        }
        s.state.val_history.append({k: v for k, v in record.items() if k != "event"})
        self.metrics.write(record)
        if s.is_main and s.cfg.eval_samples:
            self.write_samples(step, spoken)
        if improved:
            s.state.best_val, s.state.best_step = primary_mel, step
        s.log(
            f"eval ({tag}) step {step}: "
            + ", ".join(f"{k} {v:.4f}" for k, v in results.items())
            + (" (best so far)" if improved else "")
        )
        if s.accelerator.trackers:
            s.accelerator.log(results, step=step)
        s.budget.observe_eval(time.perf_counter() - t0)
        self.last_eval = time.time()
        if improved and export_best:
            t1 = time.perf_counter()
            try:
                if self.export(s.checkpoint_dir / "best_model"):
                    s.state.best_model_step = step
            except UnsafeOverwrite as err:  # a file the user put into best_model/ is never deleted
                s.log(f"warning: best model not exported: {err}")
            s.budget.observe_export(time.perf_counter() - t1)
        self.last_val = results
        self.last_val_step = step
        return results

    def write_samples(self, step: int, spoken=()) -> None:
        s = self.s
        items = next(iter(s.data.val_sets.values()), None)
        if items is None:
            return
        count = min(s.cfg.eval_samples, len(items))
        sentences = []
        for k in range(count):
            sentences.append((items.clip_id(k), items.text(k), int(items.speaker_ids[k])))
        folder = s.checkpoint_dir / "samples" / checkpoint_name(step)
        if len(spoken) >= count:  # the free-running pass already spoke them (same seed, same order)
            paths = write_wavs(list(spoken[:count]), folder, s.model.config.sampling_rate)
        else:
            paths = synthesize(s.model, s.text, sentences, folder, s.device)
        log_audio_to_trackers(s.accelerator, paths, step, s.model.config.sampling_rate)
        names = [name for name, _, _ in sentences]
        alignments = alignment_paths(s.generator_raw, items, count, s.device)
        np.savez_compressed(folder / "alignments.npz", **dict(zip(names, alignments, strict=True)))
        pngs = write_pictures(folder, names, alignments, list(spoken[:count]))
        log_images_to_trackers(s.accelerator, pngs, step)

    def trainer_state(self) -> dict:
        s = self.s
        return {
            "global_step": s.budget.global_step,
            "train_state": s.state.to_dict(),
            "budget": s.budget.state_dict(),
            "val_ids": s.data.val_ids,
            "speakers": s.speakers,
            "config": s.cfg.to_dict(),
            "model_source": s.model_source,
            "git_revision": git_revision(),
            "threads": self.threads,
            **self.micro_batch_used(),
            "versions": {"torch": torch.__version__, "transformers": _version("transformers")},
        }

    def save_checkpoint(self, why: str) -> Path | None:
        """Write a complete checkpoint (main process); a failed write warns and training goes on."""
        s = self.s
        t0 = time.perf_counter()
        path = None
        if s.is_main:
            files = checkpoint_files(
                s.model,
                s.text.tokenizer,
                s.discriminator_raw,
                s.g_optimizer,
                s.d_optimizer,
                s.g_scheduler,
                s.d_scheduler,
                s.accelerator.scaler,
                self.trainer_state(),
            )
            try:
                path = write_checkpoint(s.checkpoint_dir, s.budget.global_step, files, info={"why": why})
            except OSError as err:
                s.log(
                    f"warning: checkpoint at step {s.budget.global_step} failed ({err.strerror or err}); "
                    f"the previous one is intact, retrying at the next interval"
                )
            else:
                self.last_checkpoint = path
                prune_checkpoints(s.checkpoint_dir, s.cfg.keep_checkpoints, protect=path)
        s.accelerator.wait_for_everyone()
        s.budget.observe_save(time.perf_counter() - t0)
        self.last_save = time.time()
        return path

    def export(self, folder: Path) -> Path | None:
        s = self.s
        if not s.is_main:
            return None
        speakers = s.speakers if s.model.config.num_speakers > 1 else None

        def extras(tmp: Path) -> None:
            save_discriminator(s.discriminator_raw, tmp)
            # the held-out clips, so a later feedback run keeps validating on clips never trained on
            split = {"val_ids": s.data.val_ids, "data_dir": str(s.cfg.data_dir), "seed": s.cfg.seed}
            (tmp / SPLIT_FILE).write_text(json.dumps(split, ensure_ascii=False), encoding="utf-8")

        kind = "best_model" if folder == s.checkpoint_dir / "best_model" else "final_model"
        return export_model(
            s.model, s.text.tokenizer, folder, speakers, extras=extras, kind=kind, run=s.checkpoint_dir
        )

    # ---- the loop --------------------------------------------------------------------------------

    def train(self) -> dict:
        s, cfg, budget, state = self.s, self.s.cfg, self.s.budget, self.s.state
        acc = s.accelerator
        signals = SignalStop(s.log)
        progress = Progress(s.log, s.is_main, s.device)
        if cfg.report_to != "none":
            acc.init_trackers("vits_trainer", config=_flat_config(cfg.to_dict()))
        s.log(describe_threads(self.threads))
        if s.resumed_from is None and s.val_loaders:
            self.warm_up_first_calls()
            self.run_eval("start", export_best=False)  # baseline, and a measured eval time for the plan
            self.estimate_step_from_eval()
        warning = budget.horizon_warning()
        if warning:
            s.log(f"warning: {warning}")
        budget.start_training()
        self.start_micro_batch()
        # asked before the first step too: a step that cannot finish before the deadline is not started
        stop_reason, _ = self.stop_decision(signals)
        if stop_reason == "budget":
            s.log(
                f"budget: no time for a training step ({budget.remaining():.0f} s left, a step takes "
                f"~{budget.typical_step_seconds():.0f} s, the final reserve ~{budget.final_reserve():.0f} s)"
            )
        window = self.new_window()
        while stop_reason is None:
            s.sampler.set_epoch(state.epoch)
            s.sampler.set_start(state.batch_in_epoch)
            n_batches = len(s.sampler)
            b = state.batch_in_epoch
            pending: list[dict] = []  # this cycle's batches (CPU), kept to retry the cycle after an OOM
            it = iter(s.loader) if b < n_batches else iter(())
            t_step = time.perf_counter()
            while b < n_batches:
                t0 = time.perf_counter()
                try:
                    batch = next(it)
                except StopIteration:
                    break
                wait = time.perf_counter() - t0
                self.data_wait += wait
                window["wait"] += wait
                cycle_start = (b // self.accumulation) * self.accumulation
                cycle_length = min(self.accumulation, n_batches - cycle_start)
                pending.append(batch)
                b += 1
                if b - cycle_start < cycle_length:
                    continue  # the step's clips are gathered first, then cut into micro-batches
                size = self.trial.current() if self.trial is not None else None
                micro, clean = self.micro_size(), True
                try:
                    result = self.run_cycle(pending, micro, window)
                except Exception as err:
                    if not is_out_of_memory(err):
                        raise
                    result, micro = self.retry_after_oom(pending, window, micro)
                    clean = False
                self.last_micro = micro

                # ---- an optimiser step ended --------------------------------------------------
                now = time.perf_counter()
                seconds, t_step = now - t_step, now
                samples = sum(x["indices"].numel() for x in pending) * acc.num_processes
                # a trial's steps count, but measure the run only once its size is chosen
                budget.observe_step(seconds, samples, measured=size is None)
                if size is not None and self.trial is not None:
                    # an epoch's short last step (fewer clips) would skew the time per sample: not measured
                    full = samples == self.step_clips * acc.num_processes
                    self.trial.observe(size, seconds, samples, clean and full)
                    self.trial_steps.append((size, seconds, samples, clean))
                    if self.trial.done:
                        self.finish_trial()
                save_due = time.time() - self.last_save >= cfg.save_minutes * 60
                stop_reason, save_now = self.stop_decision(
                    signals, save_due and budget.can_afford(budget.save_seconds())
                )
                s.g_scheduler.step()  # after the decision: every rank now has the same LR progress
                s.d_scheduler.step()
                self.train_seconds += seconds
                window["samples"] += samples
                window["seconds"] += seconds
                window["steps"] += 1
                state.samples_seen += samples
                state.batch_in_epoch = b
                self.after_step(result, pending)
                pending = []
                self.follow_load()

                if budget.current_plan is None and budget.benchmark_done():
                    self.make_plan(progress)
                if self.warmup_reported is None:
                    self.report_warmup_cap()
                if budget.global_step % cfg.log_every == 0:
                    self.log_step(window, progress, n_batches - b)
                    window = self.new_window()
                if save_now and not stop_reason:  # a stop saves anyway, at the end
                    self.save_checkpoint("interval")
                if stop_reason:
                    break
                t_step = time.perf_counter()  # logging and saving are not part of the next step's time
            if stop_reason:
                break
            # ---- epoch end --------------------------------------------------------------------------
            state.epoch += 1
            state.batch_in_epoch = 0
            state.epochs_completed += 1
            if budget.current_plan is not None:
                budget.replan()
            self.epoch_end_housekeeping()
            stop_reason, _ = self.stop_decision(signals)
        progress.close()
        signals.restore()
        if self.cpu_share is not None:
            self.threads["thread_changes"] = self.cpu_share.changes
            self.threads["torch_threads_at_end"] = self.cpu_share.threads
        summary = self.finish(stop_reason)
        if self.cpu_share is not None and self.cpu_share.changes:  # the process's own setting again
            self.cpu_share.apply(self.cpu_share.max_threads)  # (a notebook goes on using it)
        if s.run_lock is not None:  # the run has ended: the next one may use the folder
            s.run_lock.release()
        return summary

    def follow_load(self) -> None:
        """Fewer threads while other processes keep this run's CPUs busy, all of them again once they stop."""
        if self.cpu_share is None:
            return
        message = self.cpu_share.poll()
        if message:
            self.s.log(message)
            self.metrics.write(
                {
                    "event": "threads",
                    "step": self.s.budget.global_step,
                    "threads": self.cpu_share.threads,
                    "others_cpus": self.cpu_share.others,
                }
            )

    @staticmethod
    def new_window() -> dict:
        return {"samples": 0, "seconds": 0.0, "wait": 0.0, "steps": 0, "micro": 0, "sums": {}}

    def micro_size(self) -> int:
        """Clips per micro-batch for the next step: the trial's size while it runs, else the chosen one,
        divided by the out-of-memory split."""
        s = self.s
        base = self.trial.current() if self.trial is not None else s.state.micro_batch_size
        return max(1, math.ceil((base or s.cfg.batch_size) / s.state.split))

    def run_cycle(self, pending: list[dict], micro: int, window: dict):
        """One optimiser step: this cycle's loader batches as micro-batches of at most `micro` clips."""
        s = self.s
        parts = micro_batches(pending, micro)
        result = None
        for j, part in enumerate(parts):
            part = {k: v for k, v in part.items() if k not in ("indices", "text_lengths")}
            part = move_batch(part, s.device)
            result = self.step_fn.micro_step(part, j == 0, j == len(parts) - 1, 1.0 / len(parts))
            window["micro"] += 1
            for k, v in result.metrics.items():
                window["sums"][k] = window["sums"].get(k, 0.0) + v.float()
        return result

    def retry_after_oom(self, pending: list[dict], window: dict, failed: int):
        """Free memory and redo this cycle from its start with a smaller micro-batch (same clips): during
        the trial the size that failed (and every larger one) is ruled out and the fastest measured one
        is used; otherwise, or when none is left, the micro-batch is halved. (result, micro size)."""
        s = self.s
        if s.accelerator.num_processes > 1:
            raise UserError(
                f"out of GPU memory on process {s.accelerator.process_index}; with several processes the "
                f"automatic retry is off (the others would wait forever): lower --micro_batch_size (or "
                f"--batch_size) and resume"
            )
        while True:
            self.step_fn.abandon_cycle()
            window["sums"], window["micro"] = {}, 0
            free_memory()
            micro = None
            if self.trial is not None:
                larger = [m for m in self.trial.sizes if m > failed]
                s.log(
                    f"micro-batch trial: {failed} clips ran out of memory at step {s.budget.global_step + 1}: "
                    f"ruled out{' with ' + ', '.join(map(str, larger)) if larger else ''}"
                )
                self.metrics.write(
                    {"event": "oom", "step": s.budget.global_step, "micro_batch_size": failed, "trial": True}
                )
                self.trial.exclude(failed)
                if not self.trial.done:
                    micro = self.micro_size()
                else:
                    self.finish_trial()
                    if s.state.micro_batch_size < failed:  # a smaller size was measured: it fits
                        micro = self.micro_size()
            if micro is None:
                before = failed
                if before <= 1:
                    raise UserError(
                        "out of GPU memory even with a micro-batch of 1 clip: lower --segment_size, prepare "
                        "shorter clips (prepare_data.py --max_seconds), use --bf16/--fp16, or a smaller model"
                    )
                s.state.split *= 2
                micro = self.micro_size()
                s.log(
                    f"out of memory at step {s.budget.global_step + 1}: micro-batch {before} -> {micro} "
                    f"clips, gradient accumulation {accumulation_for(self.step_clips, before)} -> "
                    f"{accumulation_for(self.step_clips, micro)} (same effective batch); retrying the step"
                )
                self.metrics.write({"event": "oom", "step": s.budget.global_step, "split": s.state.split})
            try:
                return self.run_cycle(pending, micro, window), micro
            except Exception as err:
                if not is_out_of_memory(err):
                    raise
                failed = micro

    # ---- the micro-batch choice (microbatch.py) -------------------------------------------------------

    def describe_micro(self, micro: int) -> str:
        per = " per process" if self.s.accelerator.num_processes > 1 else ""
        return (
            f"{micro} clips x {accumulation_for(self.step_clips, micro)} (gradient accumulation) = "
            f"{self.step_clips} clips per optimiser step{per}"
        )

    def start_micro_batch(self) -> None:
        """Before the first step: a forced size, a resumed run's choice, or a trial (or no choice to make)."""
        s, cfg, state = self.s, self.s.cfg, self.s.state
        forced = cfg.forced_micro_batch()
        here = hardware_id(s.device)
        if forced is not None:
            if state.micro_batch_size != forced:
                state.split = 1  # the user's size: an earlier run's out-of-memory division no longer applies
            state.micro_batch_size, state.micro_batch_hardware = forced, here
            s.log(f"micro-batch: {self.describe_micro(forced)} (--micro_batch_size {forced})")
            return
        options = candidates(cfg)
        chosen = state.micro_batch_size
        keep = chosen is not None and state.micro_batch_hardware == here and self.step_clips % chosen == 0
        if self.agree(keep):  # rank 0's view: every rank must trial, or not, together
            s.log(f"micro-batch: {self.describe_micro(self.micro_size())} (chosen earlier on this hardware)")
            return
        if chosen is not None:  # (a checkpoint of an older version chose nothing: its split stays)
            changed = state.micro_batch_hardware != here
            reason = f"the hardware changed (was {state.micro_batch_hardware})" if changed else "a new batch"
            s.log(f"micro-batch: {reason}: a new trial")
            state.split = 1
        state.micro_batch_hardware, state.micro_batch_trial = here, None
        if len(options) == 1:
            state.micro_batch_size = options[0]
            return
        steps, why = self.trial_length(len(options))
        steps = self.shared_int(steps)
        if steps == 0:
            state.micro_batch_size = cfg.batch_size
            if s.is_main:
                s.log(
                    f"micro-batch trial skipped ({why}): {self.describe_micro(cfg.batch_size)} (--batch_size)"
                )
            return
        state.micro_batch_size = None
        self.trial, self.trial_steps = MicroBatchTrial(options, steps), []
        if s.is_main:
            s.log(
                f"micro-batch trial: {', '.join(map(str, options))} clips per pass, {steps} training steps each "
                f"(the first a warm-up){' (' + why + ')' if why else ''}; the fastest is kept"
            )

    def trial_length(self, sizes: int) -> tuple[int, str]:
        """Steps per size the trial can afford (rank 0's clock), and why it is short or skipped."""
        s, budget = self.s, self.s.budget
        step = budget.typical_step_seconds()  # an estimate before the first step (0 if none)
        left = budget.training_end() - budget.clock()
        steps_left = s.cfg.max_steps - budget.global_step if s.cfg.max_steps else None
        for steps in (TRIAL_STEPS, TRIAL_STEPS_SHORT):
            if sizes * steps * step > TRIAL_SHARE * left:
                continue
            if steps_left is not None and sizes * steps > steps_left:
                continue
            if steps == TRIAL_STEPS:
                return steps, ""
            short_by_steps = steps_left is not None and sizes * TRIAL_STEPS > steps_left
            return steps, f"shortened: {'--max_steps' if short_by_steps else 'the budget'} is short"
        if steps_left is not None and sizes * TRIAL_STEPS_SHORT > steps_left:
            return 0, f"--max_steps leaves {steps_left} steps, it needs {sizes * TRIAL_STEPS_SHORT}"
        return 0, (
            f"the budget cannot afford it: ~{sizes * TRIAL_STEPS_SHORT * step:.0f} s of "
            f"{max(0.0, left):.0f} s of training"
        )

    def finish_trial(self) -> None:
        """The trial is over (or cut short by an out-of-memory error): rank 0's fastest size for all."""
        s, trial = self.s, self.trial
        assert trial is not None
        self.trial = None
        fastest = trial.fastest()
        chosen = self.shared_int(fastest if fastest is not None else (trial.sizes or [s.cfg.batch_size])[0])
        s.state.micro_batch_size, s.state.micro_batch_trial = chosen, trial.table()
        # the chosen size's steps after its warm-up measured the run from here on: the benchmark keeps them
        ran = [(sec, n, clean) for size, sec, n, clean in self.trial_steps if size == chosen][1:]
        s.budget.add_measurements([(sec, n) for sec, n, clean in ran if clean])
        requested, rate = trial.seconds_per_sample(s.cfg.batch_size), trial.seconds_per_sample(chosen)
        ratio = f", {requested / rate:.2f}x the requested {s.cfg.batch_size}" if requested and rate else ""
        s.log(trial.describe())
        s.log(f"micro-batch: {self.describe_micro(chosen)}: the fastest in the trial{ratio}")
        self.metrics.write(
            {"event": "micro_batch", "step": s.budget.global_step, "chosen": chosen, "trial": trial.table()}
        )

    def micro_batch_used(self) -> dict:
        """The micro-batch size and gradient accumulation the run trains with (the last step's)."""
        micro = self.last_micro or self.micro_size()
        return {
            "micro_batch_size": micro,
            "gradient_accumulation_steps": accumulation_for(self.step_clips, micro),
        }

    def after_step(self, result, pending: list[dict]) -> None:
        """Count skipped (non-finite) steps; after too many in a row, recover."""
        s = self.s
        if not result.skipped:
            s.state.consecutive_skips = 0
            return
        s.state.skipped_steps += 1
        ids = self.clip_ids([x["indices"] for x in pending])
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

    def recover(self) -> None:
        """Reload the last good weights, halve the LR, leave fp16; one line says what happened."""
        s = self.s
        count = s.state.consecutive_skips
        parts = None
        if self.last_checkpoint is not None:
            try:  # read every part first: a damaged one must not leave the weights half restored
                ckpt = LoadedCheckpoint(self.last_checkpoint, verify_checkpoint(self.last_checkpoint))
                parts = [
                    ckpt.tensors("generator.safetensors"),
                    ckpt.tensors("discriminator.safetensors"),
                    ckpt.object("optimizer_g.pt"),
                    ckpt.object("optimizer_d.pt"),
                ]
            except CheckpointError as err:  # the run goes on from the starting weights, and says so
                s.log(f"warning: recovery cannot reload {self.last_checkpoint}: {err}")
                self.metrics.write(
                    {
                        "event": "damaged_checkpoint",
                        "step": s.budget.global_step,
                        "path": str(self.last_checkpoint),
                    }
                )
        if parts is not None:
            restore_weights(s.model, s.discriminator_raw, parts[0], parts[1])
            s.g_optimizer.load_state_dict(parts[2])
            s.d_optimizer.load_state_dict(parts[3])
            source = f"checkpoint {self.last_checkpoint.name}"
        else:
            restore_weights(s.model, s.discriminator_raw, *self.initial_weights)
            s.g_optimizer.state.clear()
            s.d_optimizer.state.clear()
            source = "the starting weights"
        s.state.lr_scale *= 0.5
        apply_lr_scale(s)
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

    def report_warmup_cap(self) -> None:
        """The warmup cap's line: when the first estimate sets it, and again if the plan changes it."""
        message = self.s.budget_lr.warmup_message()
        if message and message != self.warmup_reported:
            self.s.log(message)
            self.warmup_reported = message

    def warm_up_first_calls(self) -> None:
        """Pay the one-time costs of an evaluation's libraries before the start evaluation is timed: its
        time is the budget's estimate for every later evaluation, the final one included, until another
        is measured (a short run measures none). Quiet, 2 cores: the alignment search's numba
        compilation 1.0 s, librosa's DTW 1.8 s, matplotlib 0.6 s, against ~0.8 s for the evaluation
        itself; beside two CPU-bound processes the start evaluation took 8 s and the final one ~2 s, so
        the final reserve kept ~6 s of a 120 s run unused. The time is spent either way."""
        s, cfg = self.s, self.s.cfg
        log_lik = torch.zeros(1, 2, 3, device=s.device)
        maximum_path(
            log_lik,
            torch.tensor([2], device=s.device),
            torch.tensor([3], device=s.device),
            backend=s.generator_raw.mas_backend,
        )
        if cfg.freerun_samples:
            dtw_scores(np.zeros((4, 3), dtype=np.float32), np.zeros((4, 5), dtype=np.float32))
        if cfg.eval_samples and s.is_main:
            warm_up_pictures()

    def estimate_step_from_eval(self) -> None:
        """The budget's step time before the first step: the start evaluation's time per clip, scaled."""
        s = self.s
        clips = sum(len(v) for v in s.data.val_sets.values())
        if clips <= 0:
            return
        per_clip = s.budget.eval_seconds() / clips
        samples = self.step_clips * s.accelerator.num_processes
        s.budget.set_estimates(step_seconds=STEP_SECONDS_PER_EVAL_CLIP_SECONDS * per_clip * samples)

    def make_plan(self, progress: Progress) -> None:
        s = self.s
        effective = self.step_clips * s.accelerator.num_processes
        plan = s.budget.plan(s.data.samples_per_epoch, effective)
        s.log(plan.describe())
        self.report_warmup_cap()
        progress.set_total(plan.optimizer_steps + (self.resumed_from_step or 0), s.budget.global_step)
        self.metrics.write({"event": "plan", "step": s.budget.global_step, **plan.to_dict()})

    def log_step(self, window: dict, progress: Progress, batches_left: int) -> None:
        s = self.s
        micro = max(1, window["micro"])
        values = {k: float(v) / micro for k, v in window["sums"].items()}  # the one sync of a log step
        values = {k: (v if math.isfinite(v) else None) for k, v in values.items()}  # strict JSON
        values["samples_per_second"] = window["samples"] / max(window["seconds"], 1e-9)
        values["data_wait_fraction"] = window["wait"] / max(window["seconds"], 1e-9)
        values["lr"] = s.g_optimizer.param_groups[0]["lr"]
        values["skipped_steps"] = s.state.skipped_steps
        values["recoveries"] = s.state.recoveries
        record = {"step": s.budget.global_step, "epoch": s.state.epoch, "time": time.time(), **values}
        if s.device.type == "cuda":
            record["vram_gb"] = torch.cuda.max_memory_allocated(s.device) / 2**30
        self.metrics.write(record)
        if s.accelerator.trackers:
            s.accelerator.log(values, step=s.budget.global_step)
        epoch_eta = batches_left / self.accumulation * s.budget.step_seconds()
        progress.update(s.budget.global_step, values, s.budget, epoch_eta)

    def epoch_end_housekeeping(self) -> None:
        s, budget = self.s, self.s.budget
        since_eval = time.time() - self.last_eval
        eval_due = bool(s.val_loaders) and since_eval * OVERHEAD_SHARE >= budget.eval_seconds()
        if self.agree(eval_due and budget.can_afford(budget.eval_seconds() + budget.export_seconds())):
            self.run_eval(f"epoch {s.state.epoch}")
        since_save = time.time() - self.last_save
        save_due = since_save * OVERHEAD_SHARE >= budget.save_seconds()
        if self.agree(save_due and budget.can_afford(budget.save_seconds())):
            self.save_checkpoint("epoch")

    def finish(self, stop_reason: str | None) -> dict:
        s, budget = self.s, self.s.budget
        if stop_reason != "signal" and s.val_loaders:
            # the last steps may have been slower than planned (a busy machine): the checkpoint and the
            # export come first, the final evaluation only if it still fits
            left = budget.remaining() - (
                budget.save_seconds() + budget.export_seconds() + budget.safety_seconds()
            )
            if self.agree(left >= budget.eval_seconds()):
                self.run_eval("final", export_best=False)
            else:
                self.final_eval_skipped = f"no time left: {max(0.0, left):.0f} s left for it, it takes ~{budget.eval_seconds():.0f} s"
                s.log(f"final evaluation skipped: {self.final_eval_skipped}")
        elif stop_reason == "signal":
            self.final_eval_skipped = "stopped by a signal"
        final_is_best = bool(s.state.val_history) and s.state.best_step == budget.global_step
        self.save_checkpoint(stop_reason or "end")
        t0 = time.perf_counter()
        exported = None
        try:
            exported = self.export(s.output_dir)
        except (OSError, UnsafeOverwrite) as err:
            s.log(
                f"error: exporting the final model to {s.output_dir} failed ({getattr(err, 'strerror', None) or err}); "
                f"the last good checkpoint is {self.last_checkpoint}"
            )
        if exported and final_is_best:
            best = s.checkpoint_dir / "best_model"
            try:
                check_replaceable(best)  # our marked export only, nothing the user put in it
                tmp = best.with_name(f".best_model.tmp-{os.getpid()}")
                shutil.rmtree(tmp, ignore_errors=True)  # this pid's temp folder
                shutil.copytree(exported, tmp)
                write_marker(tmp, "best_model", s.checkpoint_dir)
                replace_export(tmp, best)
                s.state.best_model_step = budget.global_step
            except (OSError, UnsafeOverwrite) as err:  # the final model is exported; only this copy failed
                s.log(f"warning: best model not updated ({getattr(err, 'strerror', None) or err})")
        budget.observe_export(time.perf_counter() - t0)
        summary = self.summary(stop_reason, exported)
        if s.is_main:
            if exported:
                write_export_file(exported, "train_summary.json", json.dumps(summary, indent=1))  # + marker
            # checkpoint dir: the run's own folder, never a data folder or --output_dir (safety.py)
            (s.checkpoint_dir / "train_summary.json").write_text(
                json.dumps(summary, indent=1), encoding="utf-8"
            )
            try:
                plot_losses(s.checkpoint_dir / "metrics.jsonl", s.checkpoint_dir / "loss_curve.png")
            except Exception as err:  # a plot is never worth losing the run's ending over
                s.log(f"warning: loss curve not written ({err})")
        if s.accelerator.trackers:
            s.accelerator.end_training()
        s.accelerator.wait_for_everyone()
        return summary

    def summary(self, stop_reason: str | None, exported: Path | None) -> dict:
        s, budget, state = self.s, self.s.budget, self.s.state
        first = budget.first_plan
        best = existing_best_model(s.checkpoint_dir, state.best_model_step)
        return {
            "target_seconds": budget.target_seconds,
            "wall_seconds": budget.elapsed(),
            "steps": budget.global_step,
            "session_steps": budget.session_steps,
            "epochs_planned": first.epochs if first else None,
            "epochs_completed": state.epochs_completed,
            "epochs_trained": state.samples_seen / max(1, s.data.samples_per_epoch),
            # measured over every step of this session (the budget's own figure skips the warm-up steps)
            "samples_per_second": budget.session_samples / self.train_seconds if self.train_seconds else 0.0,
            "threads": self.threads,
            "best_val_loss": state.best_val,
            "best_step": state.best_step,
            # the evaluation of the final weights only; never an earlier one standing in for it
            "final_val": self.last_val if self.last_val_step == budget.global_step else None,
            "final_eval_skipped": (
                None if self.last_val_step == budget.global_step else self.final_eval_skipped or "not run"
            ),
            "stopped_reason": stop_reason or "end",
            "budget_stop": self.budget_stop,
            "resumed_from_step": self.resumed_from_step,
            "data_wait_fraction": self.data_wait / max(self.train_seconds, 1e-9),
            "preload_seconds": s.preload_seconds,
            "skipped_steps": state.skipped_steps,
            "plan": first.to_dict() if first else None,
            **self.micro_batch_used(),
            "micro_batch_trial": state.micro_batch_trial,
            "final_model": str(exported) if exported else None,
            "last_checkpoint": str(self.last_checkpoint) if self.last_checkpoint else None,
            "best_model": str(best) if best is not None else None,
            "best_model_step": state.best_model_step if best is not None else None,
        }


def existing_best_model(checkpoint_dir: Path, best_model_step: int | None) -> Path | None:
    """`<checkpoint_dir>/best_model` when this run exported one and it is complete (exports are renamed
    into place whole, so a folder with its weights is complete); else None. The start evaluation
    measures the model the run started from and exports nothing: a run whose evaluations never beat it
    has no best_model."""
    folder = checkpoint_dir / "best_model"
    if best_model_step is None or not (folder / "config.json").is_file():
        return None
    return folder if (folder / "model.safetensors").is_file() else None


def _flat_config(config: dict) -> dict:
    return {k: (v if isinstance(v, int | float | str | bool) else str(v)) for k, v in config.items()}


def _version(package: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(package)
    except Exception:
        return None
