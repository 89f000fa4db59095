"""The learning-rate schedule that follows the time budget: linear warmup in optimizer steps, then a
cosine over the fraction of the budget spent, as a torch LambdaLR.

Apart from `budget.py` (the clock and the plan) because it only reads a `Budget` (its global step, its
LR progress and the LR bookkeeping it saves in its state) and a reader of either needs not the other.

    lr = BudgetLR(budget, warmup_steps=args.warmup_steps)
    sched = make_scheduler(optimizer, lr)    # sched.step() after each Budget.observe_step
    if lr.warmup_message(): print(lr.warmup_message())   # once the plan is made

Multi-process: ranks must set the same LR, so pass rank 0's broadcast progress through
``make_scheduler(..., progress_fn=...)``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

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
    Ramanan, "Budgeted Training", ICLR 2020).
    """

    def __init__(
        self,
        budget: Budget,
        warmup_steps: int,
        min_lr_ratio: float = 0.05,
        max_warmup_fraction: float = 0.1,
    ) -> None:
        if warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps}")
        if not 0 <= min_lr_ratio <= 1:
            raise ValueError(f"min_lr_ratio must be in [0, 1], got {min_lr_ratio}")
        self.budget = budget
        self.warmup_steps = int(warmup_steps)
        self.min_lr_ratio = float(min_lr_ratio)
        self.max_warmup_fraction = float(max_warmup_fraction)

    @property
    def effective_warmup_steps(self) -> int:
        planned = self.budget.planned_horizon_steps
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
        return (
            f"warmup capped: --warmup_steps {self.warmup_steps:,} is more than "
            f"{self.max_warmup_fraction:.0%} of the {self.budget.planned_horizon_steps:,} planned optimizer "
            f"steps; using {self.effective_warmup_steps:,}"
        )

    def factor(self, optimizer_step: int, progress: float | None = None) -> float:
        """LR multiplier for global optimizer step ``optimizer_step`` (0-based).

        ``progress``: horizon progress to use instead of this process's `Budget.lr_progress` (multi-process:
        rank 0's broadcast value).
        """
        warmup = self.effective_warmup_steps
        if optimizer_step < warmup:
            return (optimizer_step + 1) / warmup
        p = self.budget.lr_progress() if progress is None else min(1.0, max(0.0, progress))
        if self.budget.lr_decay_start is None:
            self.budget.lr_decay_start = p  # warmup just ended: the cosine starts at peak from here
        start = self.budget.lr_decay_start
        if p >= 1.0 or start >= 1.0:
            return self.min_lr_ratio
        q = min(1.0, max(0.0, (p - start) / (1.0 - start)))
        return self.min_lr_ratio + (1.0 - self.min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * q))


def lr_lambda_for(
    budget_lr: BudgetLR,
    step_fn: Callable[[], int] | None = None,
    progress_fn: Callable[[], float] | None = None,
) -> Callable[[int], float]:
    """A LambdaLR lambda that ignores LambdaLR's own counter and reads the global optimizer step.

    LambdaLR's ``last_epoch`` restarts at 0 in a new process unless its state is loaded; the budget's
    ``global_step`` (restored by `Budget.load_state_dict`) cannot drift. Call ``scheduler.step()`` after
    `Budget.observe_step` so the LR set is the one for the next step. A plain closure on purpose: LambdaLR
    pickles the ``__dict__`` of callable objects into its state, which would drag the Budget along.
    """
    budget = budget_lr.budget

    def lr_lambda(_last_epoch: int) -> float:
        step = budget.global_step if step_fn is None else step_fn()
        return budget_lr.factor(step, None if progress_fn is None else progress_fn())

    return lr_lambda


def make_scheduler(
    optimizer: torch.optim.Optimizer,
    budget_lr: BudgetLR,
    step_fn: Callable[[], int] | None = None,
    progress_fn: Callable[[], float] | None = None,
) -> torch.optim.lr_scheduler.LambdaLR:
    """A LambdaLR driven by `BudgetLR`. Peak LR = the param groups' ``initial_lr`` (their lr at first use).

    Resume: restoring the Budget is enough for the right LR; the scheduler's own state_dict round-trips too.
    """
    from torch.optim.lr_scheduler import LambdaLR

    return LambdaLR(optimizer, lr_lambda_for(budget_lr, step_fn, progress_fn))
