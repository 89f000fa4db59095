"""How many clips a run's micro-batches hold: a forced size, a resumed run's choice, or the trial run
over the first steps (`MicroBatchTrial`: its schedule and measurements; `MicroBatchPolicy`, one part of
loop.Trainer: the size in use, the trial's start and end, and the retry with smaller micro-batches after
running out of memory; `is_out_of_memory` tells such an error from others). microbatch.py cuts a step's
clips at the size chosen here.

With `--micro_batch_size auto` the first steps of training are a trial: a few real steps at each
micro-batch size from `--batch_size` up to the whole per-process batch that divides it (a larger
micro-batch does the same work in fewer, bigger passes: on a launch-bound GPU or a CPU it is faster).
Each size's first step is a warm-up (new shapes); its time per sample is the median of the rest. Only
whole steps are measured: a step short of clips (an epoch has up to two) can be a size's warm-up, else
it takes none of its steps; a size gives up after 2 x its steps in all. An
out-of-memory step rules that size (and every larger one) out. The fastest size wins; rank 0 decides.
"""

from __future__ import annotations

import gc
import math
import os
import platform
import statistics
from dataclasses import dataclass, field

import torch

from ..errors import UserError
from .config import divisors
from .microbatch import accumulation_for, whole_step_samples

TRIAL_STEPS = 4  # per candidate: one warm-up step and three measured ones
TRIAL_STEPS_SHORT = 2  # when the budget is short: one warm-up, one measured
TRIAL_SHARE = 0.2  # the trial may take at most this share of the training time left (its steps train)


def candidates(cfg) -> list[int]:
    """The sizes a trial tries: from --batch_size up to the whole step's batch, those that divide it."""
    return [m for m in divisors(cfg.step_clips) if m >= cfg.batch_size]


def hardware_id(device: torch.device) -> str:
    """What a micro-batch choice depends on: the device's kind and name, and the CPU count."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    else:
        name = _cpu_name()
    return f"{device.type}: {name}; {os.cpu_count()} CPUs"


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


@dataclass
class MicroBatchTrial:
    """The schedule and the measurements of a trial: `steps` steps at each size, smallest first: a
    warm-up, then whole steps (short ones after the warm-up are counted apart; at most 2 x `steps` steps
    per size in all). Its samples are the clips a step put through the networks, every process's."""

    sizes: list[int]
    steps: int
    # seconds per sample of the warm-up and each whole step at a size; None: not measured (a retry, a
    # short warm-up)
    times: dict[int, list[float | None]] = field(default_factory=dict)
    short: dict[int, int] = field(default_factory=dict)  # an epoch's short steps run at each size
    excluded: list[int] = field(default_factory=list)  # ran out of memory
    _index: int = 0
    _count: int = 0

    @property
    def done(self) -> bool:
        return self._index >= len(self.sizes)

    def current(self) -> int:
        return self.sizes[self._index]

    def observe(self, size: int, seconds: float, clips: int, clean: bool = True, full: bool = True) -> None:
        """One trial step at `size` ended. `clean`: it ran once, at this size; `full`: on a whole step's
        clips. A short step (fewer clips) measures nothing and takes none of the size's steps, else one
        would take the slot of a measured step (with 2 steps per size, the only one)."""
        if self.done or size != self.current():
            return
        if not full and size in self.times:  # (a short first step still warms the size up)
            self.short[size] = self.short.get(size, 0) + 1
        else:
            timed = clean and full and clips > 0
            self.times.setdefault(size, []).append(seconds / clips if timed else None)
        self._count += 1
        # the size is done with its steps, or gives up (a corpus whose steps are mostly short): bounded
        if len(self.times[size]) >= self.steps or self._count >= 2 * self.steps:
            self._index, self._count = self._index + 1, 0

    def exclude(self, size: int) -> None:
        """`size` ran out of memory: it and every larger size are out of the trial."""
        self.excluded.extend(m for m in self.sizes if m >= size and m not in self.excluded)
        self.sizes = [m for m in self.sizes if m < size]
        for m in list(self.times):
            if m >= size:
                del self.times[m]
        for m in list(self.short):
            if m >= size:
                del self.short[m]
        self._index = min(self._index, len(self.sizes))
        # the size in progress was the excluded one: the next untried one (if any) starts afresh
        # (a size with short steps has its warm-up in `times`: the first step at a size always goes there)
        if self._index < len(self.sizes) and self.sizes[self._index] in self.times:
            self._index += 1
        self._count = 0

    def seconds_per_sample(self, size: int) -> float | None:
        """Median after the warm-up step; None when no step after it was measured."""
        measured = [t for t in self.times.get(size, [])[1:] if t is not None]
        return statistics.median(measured) if measured else None

    def unmeasured(self) -> list[int]:
        """The sizes left in the trial (not out of memory) that no measured step timed."""
        return [m for m in self.sizes if self.seconds_per_sample(m) is None]

    def fastest(self) -> int | None:
        rates = {m: self.seconds_per_sample(m) for m in self.sizes}
        rates = {m: r for m, r in rates.items() if r is not None}
        return min(rates, key=rates.get) if rates else None

    def table(self) -> list[dict]:
        rows = []
        for m in sorted(set(self.sizes) | set(self.excluded)):
            rate = self.seconds_per_sample(m)
            rows.append(
                {
                    "micro_batch_size": m,
                    "steps": len(self.times.get(m, [])),  # whole steps
                    "short_steps": self.short.get(m, 0),
                    "measured_steps": len([t for t in self.times.get(m, [])[1:] if t is not None]),
                    "seconds_per_sample": rate,
                    "samples_per_second": (1.0 / rate) if rate else None,
                    "out_of_memory": m in self.excluded,
                }
            )
        return rows

    def describe(self) -> str:
        cells = []
        for row in self.table():
            m = row["micro_batch_size"]
            if row["out_of_memory"]:
                cells.append(f"{m} clips: out of memory")
            elif row["samples_per_second"] is None:
                cells.append(f"{m} clips: not measured")
            else:
                cells.append(
                    f"{m} clips: {row['samples_per_second']:.1f} samples/s "
                    f"(median of {row['measured_steps']} steps after a warm-up)"
                )
        return "micro-batch trial: " + " | ".join(cells)


def is_out_of_memory(err: BaseException) -> bool:
    return isinstance(err, torch.OutOfMemoryError) or "out of memory" in str(err).lower()


def free_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


class MicroBatchPolicy:
    """The micro-batch size of a run. Owns the trial while it runs (`trial`), its steps (`trial_steps`)
    and the size the last step ran at (`last_micro`); the chosen size lives in the session's state."""

    def __init__(self, session, metrics, agreement) -> None:
        self.s = session
        self.metrics = metrics
        self.agreement = agreement
        processes, epoch = session.accelerator.num_processes, session.data.samples_per_epoch
        # clips per optimiser step, per process, as configured
        self.step_clips = session.cfg.step_clips
        # the same on all processes together: the effective batch the plan counts
        self.effective_step_clips = self.step_clips * processes
        # what a whole step trains, all processes together: fewer when the epoch is smaller than a step
        # (the budget's full_step_samples, from the same rule)
        self.whole_step_samples = whole_step_samples(self.step_clips, processes, epoch)
        # an epoch's training clips per process, rounded down (a count; TrainState.epoch_clips is a
        # digest of which clips they are)
        self.clips_per_epoch = epoch // processes
        self.trial: MicroBatchTrial | None = None  # the trial while it runs
        self.trial_steps: list[tuple[int, float, int, bool]] = []  # (size, seconds, clips, clean)
        self.last_micro: int | None = None  # the micro-batch size the last step ran at

    def clips_trained_per_step(self) -> int:
        """The clips one optimiser step trains on, per process: a whole step's shared among the processes,
        rounded up (the busiest process sets the step's time)."""
        return max(1, math.ceil(self.whole_step_samples / self.s.accelerator.num_processes))

    def size(self) -> int:
        """Clips per micro-batch for the next step: the trial's size while it runs, else the chosen one,
        divided by the out-of-memory split."""
        s = self.s
        base = self.trial.current() if self.trial is not None else s.state.micro_batch_size
        return max(1, math.ceil((base or s.cfg.batch_size) / s.state.split))

    def describe(self, micro: int) -> str:
        per = " per process" if self.s.accelerator.num_processes > 1 else ""
        # the clips a step trains: an epoch smaller than a configured step trains all of it in each
        # step, in fewer passes (6 clips at --batch_size 8, micro-batch 2: 3 passes, not 4 of 8 clips)
        clips = self.clips_trained_per_step()
        whole = (
            "" if clips == self.step_clips else f", the whole epoch (a step of {self.step_clips} otherwise)"
        )
        return (
            f"{micro} clips x {accumulation_for(clips, micro)} (gradient accumulation) = "
            f"{clips} clips per optimiser step{per}{whole}"
        )

    def start(self) -> None:
        """Before the first step: a forced size, a resumed run's choice, or a trial (or no choice to make)."""
        s, cfg, state = self.s, self.s.cfg, self.s.state
        forced = cfg.forced_micro_batch()
        here = hardware_id(s.device)
        if forced is not None:
            if state.micro_batch_size != forced:
                state.split = 1  # the user's size: an earlier run's out-of-memory division no longer applies
                # nor does a trial's table, which chose another size: a later `auto` session trials again
                state.micro_batch_trial = None
            state.micro_batch_size, state.micro_batch_hardware = forced, here
            s.log(
                f"micro-batch: {self.describe(self.size())} (--micro_batch_size {forced}{self._split_note()})"
            )
            return
        options = candidates(cfg)
        chosen = state.micro_batch_size
        same = chosen is not None and state.micro_batch_hardware == here and self.step_clips % chosen == 0
        # a size no trial chose (an earlier session too short for one) is tried again: this session may
        # afford the trial, and the default size can be several times slower than the best on a GPU
        keep = same and state.micro_batch_trial is not None
        if self.agreement.flag(keep):  # rank 0's view: every rank must trial, or not, together
            s.log(
                f"micro-batch: {self.describe(self.size())} (chosen earlier on this hardware{self._split_note()})"
            )
            return
        if chosen is not None:  # (a checkpoint of an older version chose nothing: its split stays)
            if not same:
                changed = state.micro_batch_hardware != here
                reason = (
                    f"the hardware changed (was {state.micro_batch_hardware})" if changed else "a new batch"
                )
                s.log(f"micro-batch: {reason}: a new trial")
            state.split = 1  # the sizes are measured afresh (an out-of-memory error rules one out again)
        state.micro_batch_hardware, state.micro_batch_trial = here, None
        if len(options) == 1:
            state.micro_batch_size = options[0]
            return
        if self.whole_step_samples < self.effective_step_clips:  # every step is short: none would be measured
            state.micro_batch_size = cfg.batch_size
            if s.is_main:
                clips = self.clips_per_epoch
                s.log(
                    f"micro-batch trial skipped (only {clips} training clips per epoch, fewer than a step's "
                    f"{self.step_clips}): each step trains on those {clips}, in micro-batches of "
                    f"{cfg.batch_size} (--batch_size)"
                )
            return
        steps, why = self.trial_length(len(options))
        steps = self.agreement.integer(steps)
        if steps == 0:
            state.micro_batch_size = cfg.batch_size
            if s.is_main:
                s.log(f"micro-batch trial skipped ({why}): {self.describe(cfg.batch_size)} (--batch_size)")
            return
        state.micro_batch_size = None
        self.trial, self.trial_steps = MicroBatchTrial(options, steps), []
        if s.is_main:
            s.log(
                f"micro-batch trial: {', '.join(map(str, options))} clips per pass, {steps} training steps each "
                f"(the first a warm-up){' (' + why + ')' if why else ''}; the fastest is kept"
            )

    def _split_note(self) -> str:
        split = self.s.state.split
        return f", divided by {split} after an out-of-memory error" if split > 1 else ""

    def steps_for(self, whole: int) -> int:
        """The most steps a trial of `whole` steps can take. Steps short of clips measure nothing: an
        epoch has up to two (the cycle holding its short loader batch, its last cycle), so `whole` steps
        span at most ceil(whole / its other steps) + 1 epochs; and no size takes more than twice its
        steps."""
        if self.clips_per_epoch % self.step_clips == 0:
            return whole  # every step is whole
        cfg = self.s.cfg
        batches = math.ceil(self.clips_per_epoch / cfg.batch_size)
        others = math.ceil(batches / cfg.gradient_accumulation_steps) - 2
        if others <= 0:
            return 2 * whole
        return min(2 * whole, whole + 2 * (math.ceil(whole / others) + 1))

    def trial_length(self, sizes: int) -> tuple[int, str]:
        """Steps per size the trial can afford (rank 0's clock), and why it is short or skipped."""
        budget = self.s.budget
        step = budget.median_step_seconds()  # an estimate before the first step (0 if none)
        left = budget.training_left_by_budget()  # the time and --max_steps's steps are weighed apart
        steps_left = budget.steps_left()
        # the most steps a trial of each length can take, short steps included
        needs = {steps: self.steps_for(sizes * steps) for steps in (TRIAL_STEPS, TRIAL_STEPS_SHORT)}
        for steps, needed in needs.items():
            if needed * step > TRIAL_SHARE * left:
                continue
            if steps_left is not None and needed > steps_left:
                continue
            if steps == TRIAL_STEPS:
                return steps, ""
            short_by_steps = steps_left is not None and needs[TRIAL_STEPS] > steps_left
            return steps, f"shortened: {'--max_steps' if short_by_steps else 'the budget'} is short"
        shortest = needs[TRIAL_STEPS_SHORT]
        if steps_left is not None and shortest > steps_left:
            return 0, f"--max_steps leaves {steps_left} steps, it needs {shortest}"
        return 0, (
            f"the budget cannot afford it: ~{shortest * step:.0f} s of {max(0.0, left):.0f} s of training"
        )

    def finish_trial(self) -> None:
        """The trial is over (or cut short by an out-of-memory error): rank 0's fastest size for all."""
        s, trial = self.s, self.trial
        assert trial is not None
        self.trial = None
        fastest = trial.fastest()
        chosen = self.agreement.integer(
            fastest if fastest is not None else (trial.sizes or [s.cfg.batch_size])[0]
        )
        s.state.micro_batch_size, s.state.micro_batch_trial = chosen, trial.table()
        # the chosen size's steps after its warm-up measured the run from here on: the benchmark keeps them,
        # their clips as its samples (the same in one process; with several, an epoch's last step's can
        # differ: loop.Trainer.train_step)
        ran = [(sec, clips, clean) for size, sec, clips, clean in self.trial_steps if size == chosen][1:]
        s.budget.add_measurements([(sec, clips) for sec, clips, clean in ran if clean])
        requested, rate = trial.seconds_per_sample(s.cfg.batch_size), trial.seconds_per_sample(chosen)
        ratio = f", {requested / rate:.2f}x the requested {s.cfg.batch_size}" if requested and rate else ""
        s.log(trial.describe())
        # "the fastest" only when it was timed against every other size that did not run out of memory
        missing = trial.unmeasured()
        unmeasured = [m for m in missing if m != chosen]
        others = ", ".join(map(str, unmeasured))
        if fastest is None:
            why = (
                "no size was measured: the smallest"
                if trial.sizes
                else "every size tried ran out of memory: --batch_size"
            )
        elif unmeasured and len(trial.sizes) - len(missing) == 1:
            why = f"the only size measured ({others} {'was' if len(unmeasured) == 1 else 'were'} not)"
        elif unmeasured:
            why = f"the fastest of the sizes measured ({others} not measured){ratio}"
        else:
            why = f"the fastest in the trial{ratio}"
        s.log(f"micro-batch: {self.describe(chosen)}: {why}")
        self.metrics.write(
            {"event": "micro_batch", "step": s.budget.global_step, "chosen": chosen, "trial": trial.table()}
        )

    def is_full(self, clips: int) -> bool:
        """Whether a step of `clips` clips (all processes) was a whole step, not an epoch's short last one."""
        return clips == self.effective_step_clips

    def trial_seconds_per_sample(self) -> float | None:
        """The eager time per sample this session's trial measured at the chosen size (None without one)."""
        state = self.s.state
        if not (self.trial_steps and state.micro_batch_trial):
            return None
        rows = [r for r in state.micro_batch_trial if r["micro_batch_size"] == state.micro_batch_size]
        return rows[0]["seconds_per_sample"] if rows else None

    def observe_trial_step(self, size: int, seconds: float, clips: int, clean: bool) -> None:
        """A step of the trial at `size` clips per micro-batch ended; the trial ends after its last."""
        # an epoch's short last step (fewer clips) would skew the time per sample: not measured
        self.trial.observe(size, seconds, clips, clean, self.is_full(clips))
        self.trial_steps.append((size, seconds, clips, clean))
        if self.trial.done:
            self.finish_trial()

    def ran_at(self, micro: int) -> None:
        """The size the step just run used (smaller than `size()` after an out-of-memory split)."""
        self.last_micro = micro

    def used(self) -> dict:
        """The micro-batch size and the micro-batches per optimiser step the run trains with (named apart
        from --gradient_accumulation_steps, which counts loader batches): the chosen size (after
        any out-of-memory split), or the last step's while the trial runs. A run that ends on the
        trial's last step reports the size it chose, not the last one tried."""
        micro = self.size() if self.trial is None else (self.last_micro or self.size())
        return {
            "micro_batch_size": micro,
            # the passes a step runs: of its clips, the whole epoch when that is smaller than a step
            "micro_batches_per_step": accumulation_for(self.clips_trained_per_step(), micro),
        }

    def smaller_after_oom(self, failed: int) -> int:
        """The micro-batch to redo a cycle with after one of `failed` clips ran out of memory (the same
        clips; the caller has dropped the cycle's gradients): during the trial that size (and every
        larger one) is ruled out and the fastest measured one is used; otherwise, or when none is left,
        the micro-batch is halved."""
        s = self.s
        if s.accelerator.num_processes > 1:
            raise UserError(
                f"out of GPU memory on process {s.accelerator.process_index}; with several processes the "
                f"automatic retry is off (the others would wait forever): lower --micro_batch_size (or "
                f"--batch_size) and resume"
            )
        free_memory()
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
                return self.size()
            self.finish_trial()
            if s.state.micro_batch_size < failed:  # a smaller size was measured: it fits
                return self.size()
        if failed <= 1:
            raise UserError(
                "out of GPU memory even with a micro-batch of 1 clip: lower --segment_size, prepare "
                "shorter clips (prepare_data.py --max_seconds), use --bf16/--fp16, or a smaller model"
            )
        s.state.split *= 2
        micro = self.size()
        s.log(
            f"out of memory at step {s.budget.global_step + 1}: micro-batch {failed} -> {micro} "
            f"clips, gradient accumulation {accumulation_for(self.step_clips, failed)} -> "
            f"{accumulation_for(self.step_clips, micro)} (same effective batch); retrying the step"
        )
        self.metrics.write({"event": "oom", "step": s.budget.global_step, "split": s.state.split})
        return micro
