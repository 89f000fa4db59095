"""The learning-rate schedule that follows the time budget: linear warmup in optimizer steps, then a
cosine over the fraction of the horizon spent, as a torch LambdaLR.

It reads a `Budget` (budget.py: the clock, the global step, the plan's step count) and owns its own
state: where the cosine started, the progress ratchet, rank 0's shared progress. Where the cosine
started goes into the checkpoint beside the budget's state (`BudgetLR.state_dict`); the rest is the
session's.

    lr = BudgetLR(budget, warmup_steps=args.warmup_steps)
    lr.load_state_dict(ckpt["lr_schedule"])  # on resume
    sched = make_scheduler(optimizer, lr)    # sched.step() after each Budget.observe_step
    if lr.warmup_message(): print(lr.warmup_message())   # once the plan is made
    set_peak_lr([(optimizer, sched)], peak, lr)          # a new peak (a recovery halves it)

Multi-process: ranks must set the same LR, so rank 0's own progress and warmup cap are broadcast each
step and handed to `BudgetLR.share_progress` on every rank (rank 0 included: one value for all).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from .budget import hhmm, hours

if TYPE_CHECKING:
    import torch

    from .budget import Budget


class BudgetLR:
    """Budget-aware LR multiplier: linear warmup in optimizer steps, then cosine over wall-clock progress.

    Warmup: ``(step + 1) / w`` for global optimizer step < w (counted across sessions, so a resume never
    restarts it), where w is ``warmup_steps`` capped to ``max_warmup_fraction`` of the horizon's planned
    steps once a plan exists. Then a cosine from 1 (peak), starting at the progress where warmup ended, down
    to ``min_lr_ratio`` exactly at progress 1 (the end of the horizon), constant after. Decaying to the end of
    the *budget* rather than a guessed step count is what makes small budgets work well (Li, Yumer &
    Ramanan, "Budgeted Training", ICLR 2020). With ``max_steps`` (--max_steps) the horizon ends at that
    step when it comes before the deadline: the warmup is capped by it, and the progress is the larger
    of the time spent and the steps taken (a run ended by its step count, not its budget, still decays).
    """

    def __init__(
        self,
        budget: Budget,
        warmup_steps: int,
        min_lr_ratio: float = 0.05,
        max_warmup_fraction: float = 0.1,
        max_steps: int = 0,
    ) -> None:
        if warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps}")
        if not 0 <= min_lr_ratio <= 1:
            raise ValueError(f"min_lr_ratio must be in [0, 1], got {min_lr_ratio}")
        self.budget = budget
        self.warmup_steps = int(warmup_steps)
        self.min_lr_ratio = float(min_lr_ratio)
        self.max_warmup_fraction = float(max_warmup_fraction)
        self.max_steps = max(0, int(max_steps))  # 0: the budget alone ends the horizon
        self.decay_start: float | None = None  # progress at which warmup ended: the cosine starts there
        self._shared_progress: float | None = None  # rank 0's progress in multi-process runs
        self._shared_warmup: int | None = None  # and rank 0's warmup cap
        self._progress_floor = 0.0  # progress never goes back within a session

    def horizon_steps(self) -> tuple[int | None, str]:
        """(optimizer steps of the horizon, None before any estimate; what they are): the plan's (or the
        first steps' estimate), or those to --max_steps from where the horizon starts when fewer."""
        b = self.budget
        planned = b.planned_horizon_steps
        to_max = self.max_steps - self._horizon_first_step()  # counted as steps_progress counts them
        if self.max_steps and (planned is None or to_max < planned):
            return max(0, to_max), "optimizer steps of --max_steps"
        # before the plan, the step count is the first measured steps' rough estimate
        words = (
            "optimizer steps estimated before the plan" if b.horizon_estimated else "planned optimizer steps"
        )
        return planned, words

    @property
    def effective_warmup_steps(self) -> int:
        """The warmup in steps: rank 0's in multi-process runs (each rank plans from its own timings)."""
        return self._shared_warmup if self._shared_warmup is not None else self.own_warmup_steps()

    def own_warmup_steps(self) -> int:
        """--warmup_steps capped by this process's horizon (`horizon_steps`)."""
        planned, _ = self.horizon_steps()
        if planned is None:
            return self.warmup_steps
        return min(self.warmup_steps, int(self.max_warmup_fraction * planned))

    @property
    def warmup_capped(self) -> bool:
        return self.effective_warmup_steps < self.warmup_steps

    def warmup_message(self) -> str | None:
        """The line to print when the warmup was capped (a flag is never silently ignored)."""
        if not self.warmup_capped:
            return None
        planned, steps = self.horizon_steps()
        warmup = self.effective_warmup_steps
        if planned == 1:
            steps = steps.replace("steps", "step", 1)
        # worded as the schedule it is, not a fault: README's own rehearsal command prints it
        return (
            f"warmup: {warmup:,} step{'' if warmup == 1 else 's'} (--warmup_steps {self.warmup_steps:,}, "
            f"at most {self.max_warmup_fraction:.0%} of the {planned:,} {steps})"
            # capped to nothing, the flag does nothing: say so rather than leave it to be inferred
            + (": no warmup, --warmup_steps has no effect in so short a run" if warmup == 0 else "")
        )

    def factor(self, optimizer_step: int) -> float:
        """LR multiplier for global optimizer step ``optimizer_step`` (0-based)."""
        warmup = self.effective_warmup_steps
        if optimizer_step < warmup:
            return (optimizer_step + 1) / warmup
        p = self.progress()
        if self.decay_start is None:
            self.decay_start = p  # warmup just ended: the cosine starts at peak from here
        start = self.decay_start
        if p >= 1.0 or start >= 1.0:
            return self.min_lr_ratio
        q = min(1.0, max(0.0, (p - start) / (1.0 - start)))
        return self.min_lr_ratio + (1.0 - self.min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * q))

    # ---- the horizon: how much of it is spent -----------------------------------------------------

    def progress(self) -> float:
        """Fraction of the LR horizon spent, in [0, 1]: rank 0's in multi-process runs (`share_progress`),
        else `own_progress`."""
        return self._shared_progress if self._shared_progress is not None else self.own_progress()

    def own_progress(self) -> float:
        """Fraction of the LR horizon spent by this process's clock, in [0, 1]; never decreases within a
        session.

        With ``total_seconds``: (spent_before + elapsed) / total, except in the horizon's last session (the
        total runs out within it, or less than 3 % of the total would be left after it): there the horizon
        ends no later than this session's training end, so the minimum LR is reached by the last step, not
        during the final export or in a session that never comes. Without it: this session's training
        window, from `Budget.start_training` to `Budget.training_end` (0 before training starts). Clamped
        to 1 once the horizon is over, e.g. a total already spent on resume (see `horizon_warning`).
        """
        b = self.budget
        if b.total_seconds is None:
            if b.training_start is None:
                progress = 0.0
            else:
                window = b.training_end() - b.training_start
                progress = 1.0 if window <= 0 else (b.clock() - b.training_start) / window
        else:
            horizon_end = b.total_seconds - b.spent_before  # seconds after this process started
            if b.last_session():
                horizon_end = min(horizon_end, b.target_seconds - b.final_reserve())
            denominator = b.spent_before + horizon_end
            progress = 1.0 if denominator <= 0 else b.spent_seconds() / denominator
        if self.max_steps:
            progress = max(progress, self.steps_progress())
        # Reserves are re-measured while training, which moves the horizon's end a little; the ratchet
        # keeps the LR monotone anyway.
        progress = max(self._progress_floor, min(1.0, max(0.0, progress)))
        self._progress_floor = progress
        return progress

    def steps_progress(self) -> float:
        """The share of the horizon's steps up to --max_steps taken: over every session with
        ``total_seconds``, else over this session's (from the step it started at)."""
        b = self.budget
        first = self._horizon_first_step()
        if self.max_steps <= first:
            return 1.0
        return (b.global_step - first) / (self.max_steps - first)

    def _horizon_first_step(self) -> int:
        """The global step the horizon starts at: 0 with ``total_seconds``, else this session's first."""
        b = self.budget
        return 0 if b.total_seconds is not None else b.global_step - b.session_steps

    def share_progress(self, progress: float, warmup_steps: int | None = None) -> None:
        """Multi-process runs: use rank 0's progress and warmup (broadcast each step, and taken by rank 0
        too) so every rank sets the same LR; replicas whose learning rates differ by a hair would drift
        apart. Rank 0 sends its `own_progress` and `own_warmup_steps`, never the value shared before."""
        self._shared_progress = float(progress)
        if warmup_steps is not None:
            self._shared_warmup = int(warmup_steps)

    def horizon_warning(self) -> str | None:
        """A line for the caller to print when --total_hours does not fit this session sensibly."""
        b = self.budget
        if b.total_seconds is None:
            return None
        spent = b.spent_seconds()
        total = f"--total_hours {hours(b.total_seconds)[:-2]}"  # as given, as --target_hours is echoed
        if spent >= b.total_seconds:
            return f"{total} is already spent ({spent / 3600:.3g} h): the learning rate stays at its minimum"
        if b.total_seconds - b.spent_before < b.target_seconds - b.final_reserve():
            end = b.process_start + b.total_seconds - b.spent_before
            return (
                f"{total} ends before this session's training "
                f"(at ~{hhmm(end, b.clock())}): the learning rate stays at its minimum after that"
            )
        return None

    def horizon_note(self, peak: float) -> str | None:
        """A line for a resumed session without --total_hours: its schedule is its own, so the learning
        rate goes from where the last session left it (its minimum) back to `peak`."""
        b = self.budget
        if b.total_seconds is not None or (b.global_step == 0 and b.spent_before == 0):
            return None
        return (
            f"the learning rate follows a schedule of this session's own: back to its peak ({peak:g}) "
            "and down to its minimum at this session's end; for one schedule over every session, give "
            "--total_hours (the whole training's hours) in each"
        )

    # ---- persistence ------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return {"decay_start": self.decay_start}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore from a previous session (call before training starts). Where the cosine started
        carries over only with a total horizon (``--total_hours``); without it each session is its own."""
        start = state.get("decay_start")
        self.decay_start = None if start is None or self.budget.total_seconds is None else float(start)


def set_peak_lr(
    pairs: Iterable[tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]],
    peak: float,
    budget_lr: BudgetLR,
) -> None:
    """Make `peak` the top of each (optimizer, scheduler)'s schedule, and set this step's LR from it."""
    lr = peak * budget_lr.factor(budget_lr.budget.global_step)
    for optimizer, scheduler in pairs:
        scheduler.base_lrs = [peak for _ in optimizer.param_groups]
        for group in optimizer.param_groups:
            group["initial_lr"] = peak
            group["lr"] = lr


def lr_lambda_for(budget_lr: BudgetLR) -> Callable[[int], float]:
    """A LambdaLR lambda that ignores LambdaLR's own counter and reads the global optimizer step.

    LambdaLR's ``last_epoch`` restarts at 0 in a new process unless its state is loaded; the budget's
    ``global_step`` (restored by `Budget.load_state_dict`) cannot drift. Call ``scheduler.step()`` after
    `Budget.observe_step` so the LR set is the one for the next step. A plain closure on purpose: LambdaLR
    pickles the ``__dict__`` of callable objects into its state, which would drag the Budget along.
    """
    budget = budget_lr.budget

    def lr_lambda(_last_epoch: int) -> float:
        return budget_lr.factor(budget.global_step)

    return lr_lambda


def make_scheduler(
    optimizer: torch.optim.Optimizer, budget_lr: BudgetLR
) -> torch.optim.lr_scheduler.LambdaLR:
    """A LambdaLR driven by `BudgetLR`. Peak LR = the param groups' ``initial_lr`` (their lr at first use).

    Resume: restoring the Budget is enough for the right LR; checkpoints keep no scheduler state.
    """
    from torch.optim.lr_scheduler import LambdaLR

    return LambdaLR(optimizer, lr_lambda_for(budget_lr))
