"""The time budget: clock, throughput measurement, training plan, deadline. The learning-rate
schedule that follows it (`BudgetLR`) is in lr_schedule.py and only reads it.

One `Budget` per process. It is counted from *process start* (the CLI passes
``psutil.Process().create_time()``), so model loading, the benchmark, evals, saves and the final export
all live inside ``--target_hours``. The training loop asks `Budget.should_stop` before its first
optimizer step, after each one and at each epoch end; the run then does its final eval + save + export,
which `Budget.final_reserve` keeps room for.

Typical loop::

    budget = Budget(target_h * 3600, process_start, total_seconds=total_h * 3600 if total_h else None)
    budget.set_estimates(save_seconds=..., export_seconds=...)   # from model size, until measured
    budget.load_state_dict(ckpt["budget"])                       # on resume
    lr = BudgetLR(budget, warmup_steps=args.warmup_steps)      # lr_schedule.py (+ its own state)
    sched = make_scheduler(optimizer, lr)
    budget.start_training()
    while not budget.should_stop():
        t = time.time(); train_one_optimizer_step(); budget.observe_step(time.time() - t, n_samples)
        sched.step()
        if budget.benchmark_done() and budget.current_plan is None:
            print(budget.plan(len(train_set), effective_batch).describe())
            if lr.warmup_message(): print(lr.warmup_message())
        if eval_due and budget.can_afford(budget.eval_seconds() + budget.export_seconds()):
            evaluate()  # then observe_eval(...); a new best is exported
    final eval, save (state_dict() goes into the checkpoint), export: observe_* each

Multi-process: only the main process's clock decides. `should_stop` is a pure function of this object's
state and its clock, so rank 0 evaluates it and broadcasts the answer (the learning rate, which follows
the clock too, is shared the same way: `BudgetLR.share_progress`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any, NamedTuple

Clock = Callable[[], float]

STATE_VERSION = 1
# safety_min_seconds guards fixed jitter (process exit, filesystem sync), but on very short runs it would
# push the end below 97 % of the target; cap it to this fraction of the target.
_SAFETY_MIN_CAP_FRACTION = 0.015
# Sessions end between 97 % and 100 % of their targets, so a total sized as a sum of targets is a few %
# short of being used up: a remainder below this fraction of the total means "this is the last session".
_LAST_SESSION_SLACK = 0.03
# How far past its deadline a run may end: the next step is not started when, as slow as the last one,
# it would end later than deadline + max(1 %, 10 s) (the final reserve counted).
_OVERRUN_FRACTION, _OVERRUN_MIN_SECONDS = 0.01, 10.0
_RECENT_STEPS = 5  # the typical step is the median of this many recent steps
# Slow steps (a CPU, a big model on a small GPU) would take many minutes to reach benchmark_samples:
# this many seconds of at least two measured steps plan the run too, so a short run still gets its plan
_BENCHMARK_ENOUGH_SECONDS, _BENCHMARK_MIN_STEPS = 60.0, 2


@dataclass
class _Stat:
    """Running estimate of one duration: bias-corrected EMA plus the last value."""

    ema: float | None = None
    last: float | None = None
    count: int = 0

    def add(self, value: float, alpha: float) -> None:
        self.count += 1
        # Weight max(alpha, 1/n): a plain mean over the first 1/alpha values, so the first observation
        # does not dominate for ~1/alpha updates as a zero- or first-value-seeded EMA would.
        weight = max(alpha, 1.0 / self.count)
        self.ema = value if self.ema is None else self.ema + weight * (value - self.ema)
        self.last = value

    def conservative(self) -> float | None:
        """max(EMA, last): reacts at once to a slowdown, forgets a one-off spike gradually."""
        if self.ema is None or self.last is None:
            return None
        return max(self.ema, self.last)


class TrainingLeft(NamedTuple):
    """`Budget.training_left`'s answer."""

    seconds: float  # training seconds left: the budget's, or fewer when --max_steps ends training first
    max_steps: int  # --max_steps when it ends training before the budget does (as Plan.max_steps), else 0

    @property
    def ends_at_max_steps(self) -> bool:
        return self.max_steps > 0


def hhmm(wall: float, now: float) -> str:
    t = time.localtime(wall)
    if abs(wall - now) < 600:  # minutes alone said "training ends ~06:49, run ends ~06:49" in the demo
        return time.strftime("%H:%M:%S", t)
    if time.localtime(now)[:3] == t[:3]:
        return time.strftime("%H:%M", t)
    return time.strftime("%a %H:%M", t)


def hours(seconds: float) -> str:
    """A budget in hours as its flag is typed: two decimals made --target_hours 0.015 read "0.01 h"."""
    return f"{round(seconds / 3600, 6):g} h"


def _iso(wall: float) -> str:
    return datetime.fromtimestamp(wall).astimezone().isoformat(timespec="seconds")


@dataclass
class Plan:
    """What fits in this session, computed from measured throughput and reserves.

    Epoch and step counts are for the whole session: steps already taken (the benchmark) plus what fits
    between now and the training end.
    """

    samples_per_second: float
    seconds_per_epoch: float  # training plus the per-epoch evals/saves asked for in `Budget.plan`
    epochs: float
    full_epochs: int
    steps_per_epoch: int
    optimizer_steps: int  # this session
    horizon_steps: int  # optimizer steps over the whole LR horizon (global count): used to cap warmup
    train_end_wall: float  # when the last optimizer step must end
    run_end_wall: float  # training end + final eval + save + export (+ what comes after it)
    budget_seconds: float
    eval_seconds: float
    save_seconds: float
    export_seconds: float
    safety_seconds: float
    created_wall: float = field(default=0.0)
    after_loop_seconds: float = field(default=0.0)  # after the export: feedback samples, the hub upload
    max_steps: int = field(default=0)  # --max_steps, when it ends training before the budget does

    def describe(self) -> str:
        """A few printable lines: the plan, the final reserve, and a warning when not even an epoch fits."""
        now = self.created_wall
        lines = [
            f"plan: {self.optimizer_steps:,} steps this session"
            + (f" (to --max_steps {self.max_steps:,})" if self.max_steps else "")
            + f", {self.epochs:.1f} epochs of {self.steps_per_epoch:,} "
            f"step{'' if self.steps_per_epoch == 1 else 's'} ({self.full_epochs} full), "
            f"~{self.samples_per_second:.1f} samples/s, "
            f"training ends ~{hhmm(self.train_end_wall, now)}, run ends ~{hhmm(self.run_end_wall, now)} "
            f"(budget {hours(self.budget_seconds)})",
            f"plan: {self.seconds_per_epoch:,.0f} s per epoch; final reserve: eval {self.eval_seconds:.0f} s "
            f"+ save {self.save_seconds:.0f} s + export {self.export_seconds:.0f} s "
            f"+ safety {self.safety_seconds:.0f} s"
            # the margin guards the budget's end; a run that --max_steps ends first never reaches it
            + (
                f" (not spent: --max_steps {self.max_steps:,} ends training before the budget)"
                if self.max_steps
                else ""
            )
            + (f" + after the export {self.after_loop_seconds:.0f} s" if self.after_loop_seconds else ""),
        ]
        if self.epochs < 1.0:  # --max_steps, when set here, is what ends training, not the budget
            limit = f"--max_steps {self.max_steps:,}" if self.max_steps else "the time budget"
            lines.append(f"warning: less than one epoch fits in {limit}")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["train_end_iso"] = _iso(self.train_end_wall)
        d["run_end_iso"] = _iso(self.run_end_wall)
        return d


# ---- evaluations and checkpoints during the run: when they are due (RunOutputs acts on them) --------

OVERHEAD_SHARE = 0.1  # epoch-end evals/saves are skipped above this share of the time since the last one
# Before the first step the budget needs a step time: one training sample costs about what one validation
# clip does (the eval decodes whole clips, training a segment but with backward passes and the
# discriminator: the same order). Crude, but it only decides whether a first step can still fit.
STEP_SECONDS_PER_EVAL_CLIP_SECONDS = 1.0


def overhead_due(since_last: float, cost: float) -> bool:
    """Whether an epoch-end evaluation or checkpoint costing `cost` seconds is due: it takes at most
    OVERHEAD_SHARE of the `since_last` seconds since the last one (tiny datasets have many short epochs).
    Whether it still fits is `Budget.can_afford`'s question."""
    return since_last * OVERHEAD_SHARE >= cost


def overheads_per_epoch(epoch_seconds: float, cost: float) -> float:
    """How many of those `cost`-second evaluations or checkpoints `overhead_due` allows per epoch of
    `epoch_seconds` (at most one: they come at epoch ends), for the plan."""
    return min(1.0, OVERHEAD_SHARE * epoch_seconds / cost) if cost > 0 else 1.0


def save_minutes_passed(since_last: float, save_minutes: float) -> bool:
    """Whether a checkpoint is due after a step, whatever OVERHEAD_SHARE says: --save_minutes passed in
    the `since_last` seconds since the last one. Whether it still fits is `Budget.can_afford`'s question."""
    return since_last >= save_minutes * 60


def interval_saves_per_epoch(epoch_seconds: float, save_minutes: float) -> float:
    """How many checkpoints `save_minutes_passed` asks for per epoch of `epoch_seconds`, for the plan."""
    return epoch_seconds / (60 * save_minutes) if save_minutes > 0 else 0.0


def step_seconds_from_eval(eval_seconds: float, clips_evaluated: int, clips_trained: int) -> float | None:
    """A first step-time estimate (`Budget.set_estimates(step_seconds=...)`) before any step: the start
    evaluation's time per clip, scaled to a step of `clips_trained` clips per process (each process
    evaluates every clip, and trains its own `clips_trained` beside the others); None without a clip."""
    if clips_evaluated <= 0:
        return None
    per_clip = eval_seconds / clips_evaluated
    return STEP_SECONDS_PER_EVAL_CLIP_SECONDS * per_clip * clips_trained


class Budget:
    """Wall-clock budget of one process (session), optionally part of a multi-session LR horizon.

    Args:
        target_seconds: this process's budget, counted from ``process_start``.
        process_start: wall time the process started (``psutil.Process().create_time()``).
        total_seconds: LR horizon across resumed sessions; None: the horizon is this session's training.
        clock: wall clock, injectable for tests.
        safety_fraction, safety_min_seconds: safety margin kept at the end,
            ``max(safety_fraction * target, min(safety_min_seconds, 1.5 % of target))``.
        ema: weight of a new observation in the running estimates.
        benchmark_samples: samples measured (after the skipped steps) before `benchmark_done`.
        benchmark_skip_steps: first optimizer steps of the session excluded from the throughput
            (compilation, allocator warm-up).
        max_steps: --max_steps (global count; 0: none): a plan never promises steps beyond it.
        full_step_samples: samples a whole optimizer step trains (every process's:
            microbatch.whole_step_samples); 0: unknown, the largest step seen stands for it.
    """

    def __init__(
        self,
        target_seconds: float,
        process_start: float,
        total_seconds: float | None = None,
        clock: Clock = time.time,
        safety_fraction: float = 0.01,
        safety_min_seconds: float = 3.0,
        ema: float = 0.1,
        benchmark_samples: int = 64,
        benchmark_skip_steps: int = 2,
        max_steps: int = 0,
        full_step_samples: int = 0,
    ) -> None:
        if not target_seconds > 0:
            raise ValueError(f"target_seconds must be > 0, got {target_seconds}")
        if total_seconds is not None and not total_seconds > 0:
            raise ValueError(f"total_seconds must be > 0, got {total_seconds}")
        if not 0 < ema <= 1:
            raise ValueError(f"ema must be in (0, 1], got {ema}")
        self.target_seconds = float(target_seconds)
        self.process_start = float(process_start)
        self.total_seconds = None if total_seconds is None else float(total_seconds)
        self.clock = clock
        self.safety_fraction = safety_fraction
        self.safety_min_seconds = safety_min_seconds
        self.ema = ema
        self.benchmark_samples = max(0, int(benchmark_samples))
        self.benchmark_skip_steps = max(0, int(benchmark_skip_steps))
        self.max_steps = max(0, int(max_steps))
        self.full_step_samples = max(0, int(full_step_samples))

        self.training_start: float | None = None
        self.global_step = 0  # optimizer steps across sessions (drives warmup)
        self.session_steps = 0
        self.session_samples = 0
        self.spent_before = 0.0  # seconds spent by earlier sessions
        self._measured_samples = 0  # of the measured steps (not the unmeasured ones below)
        self._measured_seconds = 0.0
        self._last_step_seconds: float | None = None
        self._recent_steps: list[float] = []  # the last few measured step durations
        # (seconds, samples) of the steps observe_step did not measure: the session's first (skipped) ones
        # and the micro-batch trial's (measured=False); nothing to do with the LR's warmup (BudgetLR's)
        self._unmeasured_steps: list[tuple[float, int]] = []
        self._horizon_estimated = False  # planned_horizon_steps is the first estimate's, not a plan's
        self._step = _Stat()
        self._step_samples = _Stat()
        self._events = {"eval": _Stat(), "save": _Stat(), "export": _Stat()}
        self._estimates: dict[str, float] = {}
        self._priors: dict[str, float] = {}  # from the previous session's state
        self._geometry: tuple[int, int, float, float] | None = None
        self.first_plan: Plan | None = None
        self.current_plan: Plan | None = None
        # the horizon's planned optimizer steps (across sessions with total_seconds): caps the LR warmup
        self.planned_horizon_steps: int | None = None
        self._after_loop: dict[str, float] = {}  # work done after the loop's export (reserve_after_loop)

    # ---- time -------------------------------------------------------------------------------------

    def elapsed(self) -> float:
        """Seconds since process start (this session)."""
        return self.clock() - self.process_start

    def remaining(self) -> float:
        """target - elapsed; negative once past the deadline."""
        return self.target_seconds - self.elapsed()

    def deadline(self) -> float:
        """Wall time at which this session's budget ends."""
        return self.process_start + self.target_seconds

    def spent_seconds(self) -> float:
        """Seconds spent across sessions: earlier sessions plus this one so far."""
        return self.spent_before + self.elapsed()

    def safety_seconds(self) -> float:
        t = self.target_seconds
        return max(self.safety_fraction * t, min(self.safety_min_seconds, _SAFETY_MIN_CAP_FRACTION * t))

    def training_end(self) -> float:
        """Wall time by which the last optimizer step must end: deadline - final reserve."""
        return self.deadline() - self.final_reserve()

    # ---- what --max_steps leaves: the one place that reads it against the step count -------------

    def steps_left(self) -> int | None:
        """Optimizer steps --max_steps leaves (global count); None without --max_steps."""
        return max(0, self.max_steps - self.global_step) if self.max_steps else None

    def max_steps_reached(self) -> bool:
        """--max_steps is set and the run has taken that many optimizer steps."""
        return self.steps_left() == 0

    def training_left_by_budget(self) -> float:
        """Training seconds the budget leaves (to `training_end`), whatever --max_steps leaves."""
        return self.training_end() - self.clock()

    def training_left(self) -> TrainingLeft:
        """Training seconds left and what ends them: --max_steps may end training long before the budget
        does (its steps at the typical step's time). Figures only: the callers word them."""
        left = self.training_left_by_budget()
        step_seconds = self.median_step_seconds()
        steps = self.steps_left()
        if steps is not None and step_seconds > 0:
            by_steps = steps * step_seconds
            if by_steps < left:
                return TrainingLeft(by_steps, self.max_steps)
        return TrainingLeft(left, 0)

    def end_work_seconds(self) -> float:
        """What the work after the last step should take: the final reserve less its safety margin,
        which is slack kept, not time spent (1 % of a 9.5 h budget is 342 s)."""
        return self.final_reserve() - self.safety_seconds()

    def stop_rule_spare_seconds(self) -> float:
        """How much earlier than `training_end` the stop rule's headroom ends training (one step)."""
        return self._step_with_headroom_seconds() - self.median_step_seconds()

    def session_left(self) -> float:
        """Seconds until this session is expected to end, for the progress line's ETA (the plan's run
        end): --max_steps's last step, or the budget's, then the final evaluation, checkpoint and export.
        Neither the safety margin nor the stop rule's spare step is spent time."""
        left = self.training_left()
        if left.ends_at_max_steps:
            return left.seconds + self.end_work_seconds()
        return left.seconds - self.stop_rule_spare_seconds() + self.end_work_seconds()

    # ---- measurements -----------------------------------------------------------------------------

    def start_training(self) -> None:
        """Mark the start of the training loop (after preload/setup). Later calls keep the first mark."""
        if self.training_start is None:
            self.training_start = self.clock()

    def observe_step(self, seconds: float, samples: int, measured: bool = True) -> None:
        """Record one *optimizer* step: all its gradient-accumulation micro-steps and data waiting.

        ``samples``: training samples the step consumed. The first ``benchmark_skip_steps`` steps of the
        session count as steps but not towards throughput, nor do steps with ``measured=False`` (a
        micro-batch trial's: they ran at settings the run may not keep; see `add_measurements`).
        """
        if seconds < 0 or samples < 0:
            raise ValueError(f"negative step measurement: {seconds} s, {samples} samples")
        if self.training_start is None:
            self.training_start = self.clock() - seconds
        self.session_steps += 1
        self.session_samples += samples
        self.global_step += 1
        self._last_step_seconds = seconds
        if self.session_steps <= self.benchmark_skip_steps or not measured:
            self._unmeasured_steps.append((seconds, samples))
            if not self._horizon_settled():
                self._provisional_horizon()
            return
        self._measure(seconds, samples)

    def add_measurements(self, steps: list[tuple[float, int]]) -> None:
        """(seconds, samples) of steps already observed unmeasured that do represent the run from here
        on (the micro-batch trial's steps at the size it chose, after that size's warm-up step)."""
        for seconds, samples in steps:
            self._measure(seconds, samples)

    def _measure(self, seconds: float, samples: int) -> None:
        self._recent_steps = [*self._recent_steps[-(_RECENT_STEPS - 1) :], seconds]
        if not self._horizon_settled():
            self._provisional_horizon()
        self._measured_samples += samples
        self._measured_seconds += seconds
        self._step.add(seconds, self.ema)
        self._step_samples.add(float(samples), self.ema)

    def observe_eval(self, seconds: float) -> None:
        self._events["eval"].add(seconds, self.ema)

    def observe_save(self, seconds: float) -> None:
        self._events["save"].add(seconds, self.ema)

    def observe_export(self, seconds: float) -> None:
        self._events["export"].add(seconds, self.ema)

    def set_estimates(
        self,
        eval_seconds: float | None = None,
        save_seconds: float | None = None,
        export_seconds: float | None = None,
        step_seconds: float | None = None,
    ) -> None:
        """Caller's guesses (e.g. save time from model size), used until the real thing is measured.

        ``step_seconds``: one optimizer step before any was measured (e.g. scaled from the start
        evaluation), so the first step is not started blind. None leaves an estimate unchanged.
        """
        for name, value in (
            ("eval", eval_seconds),
            ("save", save_seconds),
            ("export", export_seconds),
            ("step", step_seconds),
        ):
            if value is not None:
                self._estimates[name] = max(0.0, float(value))

    def _event_seconds(self, name: str) -> float:
        measured = self._events[name].conservative()
        if measured is not None:
            return measured
        # Not measured this session: be conservative between the caller's guess and the last session.
        return max(self._estimates.get(name, 0.0), self._priors.get(name, 0.0))

    def eval_seconds(self) -> float:
        return self._event_seconds("eval")

    def save_seconds(self) -> float:
        return self._event_seconds("save")

    def export_seconds(self) -> float:
        return self._event_seconds("export")

    def average_step_seconds(self) -> float:
        """Moving average (EMA) of measured step time, for display only: the progress bar's epoch ETA, the
        benchmarks. Before any: last session's, else an unmeasured step's, else 0. The budget's decisions
        use `median_step_seconds` instead: an EMA follows one slow step."""
        if self._step.ema is not None:
            return self._step.ema
        if "step" in self._priors:
            return self._priors["step"]
        return self._last_step_seconds or 0.0

    def samples_per_second(self) -> float:
        """Throughput over measured steps (EMA of samples / EMA of seconds); else last session's; else 0."""
        if self._step.ema is not None and self._step_samples.ema is not None and self._step.ema > 0:
            return self._step_samples.ema / self._step.ema
        return self._priors.get("samples_per_second", 0.0)

    def median_step_seconds(self) -> float:
        """The typical step, what the next one should cost, robust to one outlier and to slow first steps:
        --max_steps's time left, the provisional horizon, the micro-batch trial; doubled, the stop rule.

        The median of the last few measured steps; while there are none, the fastest unmeasured step (the
        session's first are the slow ones: compilation, allocator), and before any step the
        last session's step time or the caller's estimate (`set_estimates`), else 0.
        """
        if self._recent_steps:
            ordered = sorted(self._recent_steps)
            n = len(ordered)
            return ordered[n // 2] if n % 2 else 0.5 * (ordered[n // 2 - 1] + ordered[n // 2])
        if self._unmeasured_steps:
            return self._fastest_unmeasured_step()
        return max(self._priors.get("step", 0.0), self._estimates.get("step", 0.0))

    def _fastest_unmeasured_step(self) -> float:
        """The fastest unmeasured step as a full one: a short step (an epoch's last few clips) counts at its
        time per clip, scaled to the largest step seen. Its fixed costs make that an upper bound still;
        taken as it was, an 18 s step of 4 clips stood for the 80 s steps of 32 clips (a 3-minute run
        started a step it could not finish). A whole step's size is `full_step_samples` when given: a
        session's first step can be the short one (resumed at an epoch's end), with no whole step seen."""
        full = max(self.full_step_samples, *(samples for _, samples in self._unmeasured_steps))
        return min(seconds * full / max(samples, 1) for seconds, samples in self._unmeasured_steps)

    def allowed_overrun_seconds(self) -> float:
        """How far past the deadline a run may end: max(1 %, 10 s)."""
        return max(_OVERRUN_FRACTION * self.target_seconds, _OVERRUN_MIN_SECONDS)

    def _provisional_horizon(self) -> None:
        """Planned steps from the first measured steps (after the unmeasured ones), until the benchmark's
        plan: caps the warmup from then on, so a run shorter than the benchmark still leaves warmup and
        decays."""
        if not self._recent_steps or self.training_start is None:
            return  # the unmeasured steps (compilation) would make the horizon, and the warmup, far too short
        typical = self.median_step_seconds()
        if self.total_seconds is None:
            window = self.training_end() - self.training_start
        else:
            window = self.total_seconds - self.spent_before - (self.training_start - self.process_start)
        steps = self.global_step - self.session_steps + max(1, int(window / typical))
        if self.planned_horizon_steps is None or steps < self.planned_horizon_steps:
            self.planned_horizon_steps = steps  # only ever lowered: the warmup ramp stays monotone
        self._horizon_estimated = True

    @property
    def horizon_estimated(self) -> bool:
        """planned_horizon_steps is the first measured steps' estimate, not yet a plan's."""
        return self._horizon_estimated

    def _horizon_settled(self) -> bool:
        """planned_horizon_steps is fixed: by this session's plan, or carried from an earlier session (with
        total_seconds); not unknown yet, nor the first measured steps' estimate, which later steps may
        lower and the plan replaces."""
        return self.planned_horizon_steps is not None and not self._horizon_estimated

    def benchmark_done(self) -> bool:
        """True once ``benchmark_samples`` samples were measured after the skipped first steps, or a
        minute of at least two slow steps."""
        if self._step.count == 0:
            return False
        return self._measured_samples >= self.benchmark_samples or (
            self._step.count >= _BENCHMARK_MIN_STEPS and self._measured_seconds >= _BENCHMARK_ENOUGH_SECONDS
        )

    def _step_with_headroom_seconds(self) -> float:
        """What the stop rule keeps for the next step (should_stop, can_afford, the plan's end): the median
        step, doubled."""
        # The typical step, and as much again as headroom: on a shared machine a step can take twice its
        # usual time, and that overrun would otherwise come out of the final evaluation. One step of a
        # multi-hour run is a negligible price. Typical is a median, not the slowest recent step: one slow
        # step doubled and taken as the rule would end short runs well before their deadlines.
        if not self._recent_steps and self._unmeasured_steps:
            # Only unmeasured steps so far: they are the slow ones (compilation, allocator), so the fastest is
            # already an upper bound with headroom in it; doubled, one slow first step would end a short
            # run after it (seen: 1 step at 0.4-0.8 of the budget). The slow-spell check bounds the rest.
            return self.median_step_seconds()
        return 2.0 * self.median_step_seconds()

    def _slow_spell_overruns(self) -> bool:
        # A slow spell the median has not caught up with yet: were the next step as slow as the last one,
        # the run (final reserve included) would end later than the allowed overrun.
        last = self._last_step_seconds or 0.0
        return self.clock() + last + self.final_reserve() > self.deadline() + self.allowed_overrun_seconds()

    def final_reserve(self) -> float:
        """Final eval + save + export + safety margin (+ whatever the caller does after the loop)."""
        return (
            self.eval_seconds()
            + self.save_seconds()
            + self.export_seconds()
            + self.safety_seconds()
            + self.after_loop_seconds()
        )

    def reserve_after_loop(self, seconds: float, what: str = "after") -> None:
        """Keep `seconds` of the final reserve for work done after the loop's final export (a feedback
        round's after-samples, the --push_to_hub upload), so the loop stops early enough for it; one
        amount per `what`, a later call replacing that one's."""
        self._after_loop[what] = max(0.0, float(seconds))

    def after_loop_seconds(self) -> float:
        """What is kept for the work after the loop's final export (reserve_after_loop)."""
        return sum(self._after_loop.values())

    def time_for_final_eval(self) -> float:
        """Seconds left for the final evaluation once the rest of the final reserve is kept: the
        checkpoint, the export, the work after it (an upload, a feedback round's samples), the margin."""
        return self.remaining() - (self.final_reserve() - self.eval_seconds())

    # ---- decisions --------------------------------------------------------------------------------

    def should_stop(self) -> bool:
        """True when one more typical optimizer step (plus as much again as headroom) would not leave room
        for the final reserve, or when one as slow as the last would end the run past the allowed overrun.

        Ask it before the first step too: the estimate (`set_estimates(step_seconds=...)`, a previous
        session's) keeps a step that cannot finish from starting. Pure in (state, clock): in
        multi-process runs rank 0 calls it and broadcasts the answer.
        """
        return (
            self.clock() + self._step_with_headroom_seconds() + self.final_reserve() > self.deadline()
            or self._slow_spell_overruns()
        )

    def stop_state(self) -> dict:
        """What `should_stop` weighed, for the summary: why a run ended where it did."""
        return {
            "seconds_left": round(self.deadline() - self.clock(), 2),
            "next_step_seconds": round(self._step_with_headroom_seconds(), 2),  # typical step + headroom
            "last_step_seconds": round(self._last_step_seconds or 0.0, 2),
            "final_reserve_seconds": round(self.final_reserve(), 2),
        }

    def can_afford(self, seconds: float) -> bool:
        """Whether an extra `seconds` (intermediate eval/save) still leaves one step (+ headroom) + the final reserve."""
        return (
            self.clock() + seconds + self._step_with_headroom_seconds() + self.final_reserve()
            <= self.deadline()
        )

    def plan(
        self,
        samples_per_epoch: int,
        batch_size_effective: int,
        evals_per_epoch: float = 0.0,
        saves_per_epoch: float = 0.0,
    ) -> Plan:
        """Compute the session's plan from the throughput measured so far (call when the benchmark is done).

        ``evals_per_epoch``/``saves_per_epoch``: the evals/saves the loop expects to make per epoch
        (outputs.RunOutputs.expected_per_epoch); their measured (or estimated) cost is added to the epoch
        time. The geometry is kept for `replan`. The
        horizon's first plan fixes ``planned_horizon_steps`` (the warmup cap); replans do not move it.
        """
        if samples_per_epoch <= 0 or batch_size_effective <= 0:
            raise ValueError(f"bad epoch geometry: {samples_per_epoch} samples, batch {batch_size_effective}")
        self._geometry = (int(samples_per_epoch), int(batch_size_effective), evals_per_epoch, saves_per_epoch)
        plan = self._make_plan()
        if self.first_plan is None:
            self.first_plan = plan
        if not self._horizon_settled():
            # the plan replaces the first estimate's horizon, but never raises the warmup cap it set
            provisional = self.planned_horizon_steps
            self.planned_horizon_steps = (
                plan.horizon_steps if provisional is None else min(provisional, plan.horizon_steps)
            )
            self._horizon_estimated = False
        self.current_plan = plan
        return plan

    def no_plan_line(self, ended_by: str, samples_per_second: float) -> str:
        """The plan line of a session that ended before its benchmark made a plan (a short budget, slow
        steps, a small --max_steps): the steps it was allowed, and why there is no plan."""
        steps = self.session_steps
        return (
            f"plan: no plan made: {ended_by} ended training after {steps:,} step{'' if steps == 1 else 's'} "
            f"(~{samples_per_second:.2f} samples/s), before the speed benchmark had measured its "
            f"--benchmark_samples {self.benchmark_samples:,} ({self._measured_samples:,} measured after "
            "the warm-up steps)"
        )

    def replan(self) -> Plan:
        """Recompute the plan with the current throughput EMA and measured reserves (e.g. each epoch)."""
        if self._geometry is None:
            raise RuntimeError("replan() before plan(): the epoch geometry is unknown")
        self.current_plan = self._make_plan()
        return self.current_plan

    def _make_plan(self) -> Plan:
        assert self._geometry is not None
        samples_per_epoch, batch, evals_per_epoch, saves_per_epoch = self._geometry
        sps = self.samples_per_second()
        if sps <= 0:
            raise RuntimeError("no throughput measured yet: observe some optimizer steps before planning")
        now = self.clock()
        steps_per_epoch = math.ceil(samples_per_epoch / batch)
        ev, sv, ex, safety = (
            self.eval_seconds(),
            self.save_seconds(),
            self.export_seconds(),
            self.safety_seconds(),
        )
        seconds_per_epoch = samples_per_epoch / sps + evals_per_epoch * ev + saves_per_epoch * sv
        after = self.after_loop_seconds()
        # the stop rule's headroom: no step starts unless as much again would still fit, so training
        # ends at least this long before the final reserve (without it the plan promised a step or two
        # more than a run of slow steps makes)
        spare = self.stop_rule_spare_seconds()
        train_end = self.deadline() - (ev + sv + ex + after + safety + spare)
        left = max(0.0, train_end - now)
        remaining_epochs = left / seconds_per_epoch
        remaining_steps = int(remaining_epochs * steps_per_epoch)
        # later sessions are assumed to train at this session's rate per second of budget left
        rate = remaining_steps / max(self.deadline() - now, 1e-9)
        to_max = self.steps_left()
        stops_at_max = to_max is not None and to_max < remaining_steps
        if stops_at_max:  # --max_steps ends training first: its steps, and when they end
            remaining_steps = to_max
            remaining_epochs = remaining_steps / steps_per_epoch
            train_end = now + remaining_epochs * seconds_per_epoch
        epochs = self.session_samples / samples_per_epoch + remaining_epochs
        optimizer_steps = self.session_steps + remaining_steps
        horizon_steps = optimizer_steps
        if self.total_seconds is not None:
            beyond = 0.0
            if not self.last_session():
                beyond = max(0.0, self.total_seconds - self.spent_before - self.target_seconds)
            horizon_steps = self.global_step + remaining_steps + int(beyond * rate)
            if self.max_steps:
                horizon_steps = min(horizon_steps, self.max_steps)
        return Plan(
            samples_per_second=sps,
            seconds_per_epoch=seconds_per_epoch,
            epochs=epochs,
            full_epochs=int(math.floor(epochs + 1e-9)),
            steps_per_epoch=steps_per_epoch,
            optimizer_steps=optimizer_steps,
            horizon_steps=horizon_steps,
            train_end_wall=max(now, train_end),
            run_end_wall=max(now, train_end) + ev + sv + ex + after,
            budget_seconds=self.target_seconds,
            eval_seconds=ev,
            save_seconds=sv,
            export_seconds=ex,
            safety_seconds=safety,
            created_wall=now,
            after_loop_seconds=after,
            max_steps=self.max_steps if stops_at_max else 0,
        )

    def last_session(self) -> bool:
        """With ``total_seconds``: whether the total ends within (or just after) this session."""
        assert self.total_seconds is not None
        horizon_end = self.total_seconds - self.spent_before  # seconds after this process started
        return horizon_end <= self.target_seconds + _LAST_SESSION_SLACK * self.total_seconds

    # ---- persistence ------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """What the next session needs: time spent so far, global step, measured costs as priors."""

        def measured_or_prior(name: str) -> float | None:
            value = self._events[name].conservative()
            return value if value is not None else self._priors.get(name)

        return {
            "version": STATE_VERSION,
            "spent_seconds": self.spent_seconds(),
            "global_step": self.global_step,
            "total_seconds": self.total_seconds,
            "step_seconds": self._saved_step_seconds(),
            "samples_per_second": self.samples_per_second() or None,
            "eval_seconds": measured_or_prior("eval"),
            "save_seconds": measured_or_prior("save"),
            "export_seconds": measured_or_prior("export"),
            "planned_horizon_steps": self.planned_horizon_steps,
        }

    def _saved_step_seconds(self) -> float | None:
        """The step time the next session starts from: measured, else the previous session's, else the
        fastest unmeasured step (an upper bound). Without one, a session resumed from a checkpoint taken
        during the unmeasured steps would start a step it has no time to finish."""
        if self._step.ema is not None:
            return self._step.ema
        return self._priors.get("step", self._fastest_unmeasured_step() if self._unmeasured_steps else None)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore from a previous session (call before training starts).

        Spent time and the global step continue; measured costs become priors until re-measured. The
        horizon's planned steps carry over only with ``total_seconds`` (one horizon across sessions);
        without it this session is a new horizon.
        """
        version = state.get("version", STATE_VERSION)
        if version > STATE_VERSION:
            raise ValueError(f"budget state version {version} is newer than this code ({STATE_VERSION})")
        self.spent_before = float(state.get("spent_seconds", 0.0))
        self.global_step = int(state.get("global_step", 0))
        priors = {
            "step": state.get("step_seconds"),
            "samples_per_second": state.get("samples_per_second"),
            "eval": state.get("eval_seconds"),
            "save": state.get("save_seconds"),
            "export": state.get("export_seconds"),
        }
        self._priors = {k: float(v) for k, v in priors.items() if v is not None}
        self.planned_horizon_steps = state.get("planned_horizon_steps") if self.total_seconds else None
