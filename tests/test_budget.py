"""Time budget: clock, benchmark, plan, deadline reserve, budget-aware LR. Fake clock only, no sleeps."""

from __future__ import annotations

import math
import random
import time

import pytest

from vits_trainer.training.budget import Budget
from vits_trainer.training.lr_schedule import BudgetLR, lr_lambda_for, make_scheduler, set_peak_lr


class FakeClock:
    def __init__(self, t: float = 1_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


def run_steps(budget: Budget, clock: FakeClock, n: int, seconds: float, samples: int) -> None:
    for _ in range(n):
        clock.advance(seconds)
        budget.observe_step(seconds, samples)


# ---- time -----------------------------------------------------------------------------------------


def test_elapsed_remaining_deadline_count_from_process_start():
    clock = FakeClock(1000.0)
    b = Budget(3600, process_start=900.0, clock=clock)
    assert b.elapsed() == pytest.approx(100.0)
    assert b.remaining() == pytest.approx(3500.0)
    assert b.deadline() == pytest.approx(4500.0)
    clock.advance(3600)
    assert b.remaining() == pytest.approx(-100.0)


def test_the_eta_ends_at_max_steps_when_it_comes_first():
    """The progress line's ETA: the budget's deadline, or --max_steps's last step and the end's work
    when those come first (a 25-step run read "ETA 2:16" and ended 3 s later)."""
    clock = FakeClock(0.0)
    b = Budget(3600, process_start=0.0, clock=clock)
    b.set_estimates(eval_seconds=20.0, save_seconds=30.0, export_seconds=40.0)
    run_steps(b, clock, 10, 1.0, 8)
    # the budget's end: the deadline less the safety margin and the stop rule's spare step (1 s)
    assert b.session_left() == pytest.approx(b.remaining() - b.safety_seconds() - 1.0)
    b.max_steps = 10_000
    assert b.session_left() == pytest.approx(b.remaining() - b.safety_seconds() - 1.0)
    b.max_steps = 20
    assert b.session_left() == pytest.approx(10 * 1.0 + 20 + 30 + 40)
    assert b.session_left() < b.remaining() / 10


def test_the_eta_counts_no_safety_margin():
    """A tiny model, --max_steps 10 in the default 9.5 h budget: the last step's line read "ETA 5:48" and
    the run ended seconds later; the ETA had counted the final reserve's 342 s safety margin (1 % of the
    budget), which is kept, not spent. The stop rule still keeps it."""
    clock = FakeClock(0.0)
    b = Budget(9.5 * 3600, process_start=0.0, clock=clock, max_steps=10, benchmark_samples=8)
    b.set_estimates(eval_seconds=3.0, save_seconds=0.5, export_seconds=2.0)
    run_steps(b, clock, 10, 1.0, 8)
    assert b.max_steps_reached()
    assert b.session_left() == pytest.approx(3.0 + 0.5 + 2.0)
    assert b.final_reserve() == pytest.approx(3.0 + 0.5 + 2.0 + 342.0)  # the reserve keeps its margin


@pytest.mark.parametrize("max_steps", [0, 30])
def test_the_eta_is_the_plans_run_end(max_steps):
    """The progress line's ETA and the plan's "run ends ~" are one figure, by the budget or by --max_steps."""
    clock = FakeClock(0.0)
    b = Budget(600, process_start=0.0, clock=clock, max_steps=max_steps, benchmark_samples=8)
    b.set_estimates(eval_seconds=5.0, save_seconds=1.0, export_seconds=2.0)
    run_steps(b, clock, 10, 1.0, 8)
    plan = b.plan(samples_per_epoch=800, batch_size_effective=8)
    assert clock() + b.session_left() == pytest.approx(plan.run_end_wall)


def test_the_budget_says_what_max_steps_leaves():
    """--max_steps is read against the step count in one place: the steps it leaves, whether it is
    reached, and the budget's own time left, which it does not shorten."""
    clock = FakeClock(0.0)
    b = Budget(3600, process_start=0.0, clock=clock)
    run_steps(b, clock, 10, 1.0, 8)
    assert b.steps_left() is None and not b.max_steps_reached()
    b.max_steps = 12
    assert b.steps_left() == 2 and not b.max_steps_reached()
    assert b.training_left() == (pytest.approx(2 * 1.0), 12) and b.training_left().ends_at_max_steps
    assert b.training_left_by_budget() == pytest.approx(b.training_end() - clock())
    run_steps(b, clock, 2, 1.0, 8)
    assert b.steps_left() == 0 and b.max_steps_reached()
    b.max_steps = 5  # a resumed run given fewer steps than it has taken
    assert b.steps_left() == 0 and b.max_steps_reached()


def test_safety_margin():
    clock = FakeClock(0.0)
    assert Budget(34200, 0.0, clock=clock).safety_seconds() == pytest.approx(342.0)  # 1 %
    assert Budget(200, 0.0, clock=clock).safety_seconds() == pytest.approx(3.0)  # floor
    # The floor is capped so that a one-minute run can still end after 97 % of its budget.
    assert Budget(60, 0.0, clock=clock).safety_seconds() == pytest.approx(0.9)


def test_bad_arguments():
    with pytest.raises(ValueError):
        Budget(0, 0.0)
    with pytest.raises(ValueError):
        Budget(10, 0.0, total_seconds=-1)
    with pytest.raises(RuntimeError):
        Budget(10, 0.0).replan()


# ---- benchmark ------------------------------------------------------------------------------------


def test_benchmark_excludes_warmup_steps():
    clock = FakeClock(0.0)
    b = Budget(3600, 0.0, clock=clock, benchmark_samples=32, benchmark_skip_steps=2)
    b.start_training()
    run_steps(b, clock, 2, seconds=30.0, samples=8)  # compile / allocator warm-up
    assert not b.benchmark_done()
    assert b.samples_per_second() == 0.0
    assert b.average_step_seconds() == 30.0  # nothing measured yet: the warm-up step is all we know
    run_steps(b, clock, 3, seconds=0.5, samples=8)
    assert not b.benchmark_done()  # 24 measured samples < 32
    run_steps(b, clock, 1, seconds=0.5, samples=8)
    assert b.benchmark_done()
    assert b.samples_per_second() == pytest.approx(16.0)  # warm-up steps would give ~0.26
    assert b.average_step_seconds() == pytest.approx(0.5)
    assert b.global_step == 6 and b.session_steps == 6


def test_a_minute_of_slow_steps_is_benchmark_enough():
    # 30 s steps of 8 samples would take 13 minutes to measure 200 samples: two of them plan the run
    clock = FakeClock(0.0)
    b = Budget(3600, 0.0, clock=clock, benchmark_samples=200, benchmark_skip_steps=2)
    b.start_training()
    run_steps(b, clock, 3, seconds=30.0, samples=8)
    assert not b.benchmark_done()  # one measured step: not a measurement yet
    run_steps(b, clock, 1, seconds=30.0, samples=8)
    assert b.benchmark_done() and b.samples_per_second() == pytest.approx(8 / 30)


def test_observe_step_before_start_training_starts_it():
    clock = FakeClock(100.0)
    b = Budget(3600, 0.0, clock=clock)
    clock.advance(2.0)
    b.observe_step(2.0, 4)
    assert b.training_start == pytest.approx(100.0)


# ---- plan -----------------------------------------------------------------------------------------


def make_benchmarked(target: float = 3600.0, step: float = 0.5, batch: int = 16) -> tuple[Budget, FakeClock]:
    clock = FakeClock(0.0)
    b = Budget(target, 0.0, clock=clock, benchmark_samples=64, benchmark_skip_steps=1)
    clock.advance(100.0)  # preload
    b.set_estimates(eval_seconds=20.0, save_seconds=30.0, export_seconds=40.0)
    b.start_training()
    run_steps(b, clock, 1, seconds=5.0, samples=batch)
    run_steps(b, clock, 4, seconds=step, samples=batch)
    assert b.benchmark_done()
    return b, clock


def test_plan_arithmetic():
    b, clock = make_benchmarked()
    assert b.final_reserve() == pytest.approx(20 + 30 + 40 + 36)
    plan = b.plan(samples_per_epoch=3200, batch_size_effective=16)
    assert plan.samples_per_second == pytest.approx(32.0)
    assert plan.seconds_per_epoch == pytest.approx(100.0)
    assert plan.steps_per_epoch == 200
    # no step starts unless as much again would fit: training ends a step's time (0.5 s) early
    spare = b.median_step_seconds()
    assert spare == pytest.approx(0.5)
    time_left = b.deadline() - clock() - b.final_reserve() - spare
    remaining_epochs = time_left / 100.0
    assert plan.epochs == pytest.approx(5 * 16 / 3200 + remaining_epochs)
    assert plan.full_epochs == math.floor(plan.epochs)
    assert plan.optimizer_steps == 5 + int(remaining_epochs * 200)
    assert plan.horizon_steps == plan.optimizer_steps
    assert plan.train_end_wall == pytest.approx(3600 - 126 - spare)
    assert plan.run_end_wall == pytest.approx(3600 - 36 - spare)
    text = plan.describe()
    assert text.startswith(
        f"plan: {plan.optimizer_steps:,} steps this session, {plan.epochs:.1f} epochs of 200 steps "
        f"({plan.full_epochs} full), ~32.0 samples/s, "
    )
    assert "(budget 1 h)" in text and "training ends ~" in text and "run ends ~" in text
    d = plan.to_dict()
    assert d["full_epochs"] == plan.full_epochs and "T" in d["train_end_iso"] and "T" in d["run_end_iso"]


def test_the_plan_ends_at_max_steps_when_it_comes_first():
    """--max_steps 30 in a 1 h budget: the plan line said 180 steps and an end an hour away, the report's
    budget table compared them with the 30 steps run. The plan now stops where training will."""
    b, clock = make_benchmarked()
    free = b.plan(3200, 16)
    b.max_steps = 30
    plan = b.plan(3200, 16)
    assert free.optimizer_steps > 300 and plan.optimizer_steps == 30  # 5 taken, 25 to go
    assert plan.epochs == pytest.approx(30 * 16 / 3200)
    assert plan.train_end_wall == pytest.approx(clock() + 25 * 0.5)  # 25 steps of 0.5 s
    assert plan.run_end_wall - plan.train_end_wall == pytest.approx(free.run_end_wall - free.train_end_wall)
    assert "plan: 30 steps this session (to --max_steps 30), " in plan.describe()
    # 30 steps of 200 per epoch: --max_steps, not the hour's budget, is what fits less than an epoch
    assert "less than one epoch fits in --max_steps 30" in plan.describe()
    b.max_steps = 10_000  # the budget ends training first: the plan is the budget's
    assert (
        b.plan(3200, 16).optimizer_steps == free.optimizer_steps
        and "max_steps" not in b.plan(3200, 16).describe()
    )


def test_the_reserve_line_says_the_safety_margin_is_not_spent_when_max_steps_ends_training():
    """--demo --max_steps 10 in the 9.5 h default budget printed "final reserve: ... + safety 342 s", as if
    the run would wait 6 minutes: the margin guards the budget's end, which --max_steps never reaches."""
    b, _ = make_benchmarked()
    free = b.plan(3200, 16)
    reserve = (
        f"plan: {free.seconds_per_epoch:,.0f} s per epoch; final reserve: eval {free.eval_seconds:.0f} s "
        f"+ save {free.save_seconds:.0f} s + export {free.export_seconds:.0f} s + safety 36 s"
    )
    assert free.describe().split("\n")[1] == reserve  # the budget ends training: the line as it was
    b.max_steps = 30
    plan = b.plan(3200, 16)
    assert plan.describe().split("\n")[1] == (
        reserve + " (not spent: --max_steps 30 ends training before the budget)"
    )
    # the safety figure and the stop rule's arithmetic stay the budget's
    assert plan.safety_seconds == free.safety_seconds == b.safety_seconds() == pytest.approx(36.0)
    assert plan.run_end_wall - plan.train_end_wall == pytest.approx(
        plan.eval_seconds + plan.save_seconds + plan.export_seconds
    )
    plan.after_loop_seconds = 5.0  # what comes after the export keeps its place at the end
    assert (
        plan.describe()
        .split("\n")[1]
        .endswith(
            "+ safety 36 s (not spent: --max_steps 30 ends training before the budget) + after the export 5 s"
        )
    )


def test_plan_counts_per_epoch_evals_and_saves():
    b, _ = make_benchmarked()
    plan = b.plan(3200, 16, evals_per_epoch=1, saves_per_epoch=0.5)
    assert plan.seconds_per_epoch == pytest.approx(100.0 + 20.0 + 15.0)


def test_the_plan_expects_the_evaluations_and_checkpoints_the_loop_makes():
    """Each epoch-end evaluation or checkpoint comes once at least 10x its cost has passed since the last
    (budget.OVERHEAD_SHARE), and a checkpoint at least every --save_minutes."""
    from types import SimpleNamespace

    from vits_trainer.training.outputs import RunOutputs

    budget = SimpleNamespace(eval_seconds=lambda: 20.0, save_seconds=lambda: 5.0)

    def expected(epoch_seconds: float, val: bool = True, save_minutes: float = 30.0):
        cfg = SimpleNamespace(save_minutes=save_minutes)
        outputs = SimpleNamespace(
            s=SimpleNamespace(budget=budget, val_loaders={"val": 0} if val else {}, cfg=cfg)
        )
        return RunOutputs.expected_per_epoch(outputs, epoch_seconds)

    assert expected(600.0) == (1.0, 1.0)  # both fit at every epoch end
    assert expected(100.0) == (0.5, 1.0)  # an evaluation every other epoch (20 s is 10 % of 200 s)
    assert expected(3600.0) == (1.0, 2.0)  # an hour-long epoch: a checkpoint every 30 minutes
    assert expected(100.0, val=False, save_minutes=0.5) == (0.0, 3.3333333333333335)


def test_a_checkpoint_is_due_every_save_minutes_whatever_its_share_of_the_time():
    """--save_minutes asks for a checkpoint after a step once that much time passed since the last one,
    even when the epoch-end rule (OVERHEAD_SHARE) would skip it."""
    from vits_trainer.training.budget import overhead_due, save_minutes_passed

    assert save_minutes_passed(60.0, 1.0) and not save_minutes_passed(59.5, 1.0)
    assert not overhead_due(60.0, 10.0)  # a 10 s checkpoint a minute after the last: more than 10 %


def test_replan_follows_throughput_drift():
    b, clock = make_benchmarked()
    first = b.plan(3200, 16)
    run_steps(b, clock, 200, seconds=1.0, samples=16)  # steps become 2x slower
    assert b.samples_per_second() == pytest.approx(16.0, rel=1e-3)
    second = b.replan()
    assert second.seconds_per_epoch == pytest.approx(2 * first.seconds_per_epoch, rel=1e-3)
    left = b.deadline() - clock() - b.final_reserve()
    done = b.session_samples / 3200
    assert second.epochs - done == pytest.approx(left / 200.0, rel=1e-3)
    # Had the throughput not drifted, twice as many epochs would have fitted in the same time.
    assert (second.epochs - done) == pytest.approx(0.5 * left / first.seconds_per_epoch, rel=1e-3)
    assert second.epochs < first.epochs
    assert b.first_plan is first and b.current_plan is second


def test_replan_uses_measured_reserves():
    b, clock = make_benchmarked()
    first = b.plan(3200, 16)
    b.observe_save(130.0)  # far slower than the 30 s estimate
    second = b.replan()
    assert second.save_seconds == pytest.approx(130.0)
    assert second.train_end_wall == pytest.approx(first.train_end_wall - 100.0)


def test_target_shorter_than_setup():
    clock = FakeClock(0.0)
    b = Budget(10, 0.0, clock=clock)
    b.load_state_dict({"samples_per_second": 5.0, "step_seconds": 1.0, "save_seconds": 2.0})
    clock.advance(12.0)  # preload alone overran the budget
    assert b.should_stop()
    assert not b.can_afford(0.0)
    plan = b.plan(100, 4)
    assert plan.epochs == 0.0 and plan.full_epochs == 0 and plan.optimizer_steps == 0
    assert "less than one epoch" in plan.describe()


def test_plan_needs_a_throughput():
    b = Budget(100, 0.0, clock=FakeClock(0.0))
    with pytest.raises(RuntimeError):
        b.plan(100, 4)


# ---- deadline -------------------------------------------------------------------------------------


def test_should_stop_flips_exactly_at_step_plus_headroom_plus_reserve():
    clock = FakeClock(0.0)
    b = Budget(100, 0.0, clock=clock, benchmark_skip_steps=0)
    b.start_training()
    run_steps(b, clock, 3, seconds=1.0, samples=4)
    assert b.final_reserve() == pytest.approx(1.5)  # safety only: min(3 s, 1.5 % of 100 s)
    clock.t = 96.5  # 96.5 + 1 (step) + 1 (headroom) + 1.5 == 100: still fits
    assert not b.should_stop()
    clock.t = 96.5 + 1e-6
    assert b.should_stop()
    clock.t = 90.0
    assert b.can_afford(6.5) and not b.can_afford(6.5 + 1e-6)
    # A measured save (5 s) makes it stop 5 s earlier.
    b.observe_save(5.0)
    clock.t = 91.5
    assert not b.should_stop()
    clock.t = 91.5 + 1e-6
    assert b.should_stop()


def test_a_last_step_twice_as_slow_still_leaves_the_final_reserve():
    # On a shared machine one step can take twice its usual time; that must not cost the final eval.
    clock = FakeClock(0.0)
    b = Budget(60, 0.0, clock=clock, benchmark_skip_steps=0)
    b.start_training()
    b.observe_eval(0.1)
    b.observe_save(0.1)
    b.observe_export(0.06)
    while not b.should_stop():
        run_steps(b, clock, 1, seconds=0.4, samples=8)
        last_check = clock()
    # the last step that was allowed, had it taken 0.8 s instead of 0.4 s
    assert b.deadline() - (last_check - 0.4 + 0.8) >= b.final_reserve()


def test_reserve_is_conservative():
    clock = FakeClock(0.0)
    b = Budget(1000, 0.0, clock=clock, benchmark_skip_steps=0)
    b.set_estimates(save_seconds=50.0)
    assert b.save_seconds() == 50.0  # estimate until measured
    b.observe_save(10.0)
    assert b.save_seconds() == 10.0  # measured replaces the estimate
    b.observe_save(20.0)
    assert b.save_seconds() == pytest.approx(20.0)  # max(EMA 15, last 20)
    # One more step is costed at the median of the recent steps, plus as much again: one slow step is
    # not taken as typical (it would end the run early)...
    run_steps(b, clock, 10, seconds=1.0, samples=4)
    run_steps(b, clock, 1, seconds=4.0, samples=4)
    assert b.median_step_seconds() == pytest.approx(1.0)
    clock.t = 1000 - b.final_reserve() - 2.0
    assert not b.should_stop()
    clock.t += 1e-6
    assert b.should_stop()
    # ... but a slow spell is, once it is most of the recent steps: the stop comes earlier.
    run_steps(b, clock, 2, seconds=4.0, samples=4)
    assert b.median_step_seconds() == pytest.approx(4.0)
    clock.t = 1000 - b.final_reserve() - 7.9
    assert b.should_stop()


def simulate_run(target: float, seed: int) -> tuple[float, list[float], BudgetLR, Budget]:
    """A whole run on the fake clock: preload, warm-up steps, benchmark, plan, periodic evals/saves, finals."""
    rng = random.Random(seed)
    if target <= 60:
        preload, step, ev, sv, ex, every = 4.0, 0.2, 1.5, 1.0, 2.0, 50
    elif target <= 600:
        preload, step, ev, sv, ex, every = 30.0, 0.6, 8.0, 5.0, 10.0, 100
    else:
        preload, step, ev, sv, ex, every = 300.0, 1.5, 60.0, 30.0, 90.0, 1000
    clock = FakeClock(1_700_000_000.0)
    b = Budget(target, clock(), clock=clock, benchmark_samples=64, benchmark_skip_steps=2)
    # Size-based guesses are off (save overestimated, export underestimated) until measured.
    b.set_estimates(eval_seconds=ev, save_seconds=2 * sv, export_seconds=0.5 * ex)
    lr = BudgetLR(b, warmup_steps=100)
    clock.advance(preload)
    b.start_training()
    factors = []

    def do(cost: float) -> float:
        d = cost * rng.uniform(0.9, 1.1)
        clock.advance(d)
        return d

    while not b.should_stop():
        d = step * rng.uniform(0.8, 1.25)
        if b.session_steps < 2:
            d = 20 * step  # compilation
        elif rng.random() < 0.02:
            d = 2.5 * step  # an unusually long batch
        clock.advance(d)
        b.observe_step(d, 16)
        factors.append(lr.factor(b.global_step))
        if b.current_plan is None and b.benchmark_done():
            b.plan(
                samples_per_epoch=16 * every, batch_size_effective=16, evals_per_epoch=1, saves_per_epoch=1
            )
        if b.global_step % every == 0:
            if b.can_afford(b.eval_seconds()):
                b.observe_eval(do(ev))
            if b.can_afford(b.save_seconds()):
                b.observe_save(do(sv))
            b.replan()
    b.observe_eval(do(ev))
    b.observe_save(do(sv))
    b.observe_export(do(ex))
    return clock() - b.process_start, factors, lr, b


@pytest.mark.parametrize("target", [60.0, 600.0, 9.5 * 3600])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_simulated_run_ends_within_budget(target, seed):
    end, factors, lr, b = simulate_run(target, seed)
    assert 0.97 * target <= end <= target + max(0.01 * target, 10.0), (end, target)
    assert b.current_plan is not None and b.current_plan.optimizer_steps > 0
    # LR: warmup ramp, then monotone down to (nearly) the minimum at the last step.
    w = lr.effective_warmup_steps
    assert factors[w - 1] == pytest.approx(1.0)
    after = factors[w:]
    assert all(x >= y - 1e-12 for x, y in zip(after, after[1:], strict=False))
    assert after[-1] == pytest.approx(lr.min_lr_ratio, abs=0.01)


# ---- learning rate --------------------------------------------------------------------------------


def test_lr_warmup_then_cosine_to_min_exactly_at_training_end():
    clock = FakeClock(0.0)
    b = Budget(1000, 0.0, clock=clock, benchmark_skip_steps=0)
    lr = BudgetLR(b, warmup_steps=10, min_lr_ratio=0.05)
    b.start_training()
    assert lr.progress() == 0.0
    factors = []
    for _ in range(10):
        factors.append(lr.factor(b.global_step))
        clock.advance(1.0)
        b.observe_step(1.0, 4)
    assert factors == pytest.approx([(k + 1) / 10 for k in range(10)])  # linear, peak on the 10th step
    assert b.training_end() == pytest.approx(990.0)  # reserve = safety 10 s
    assert lr.factor(b.global_step) == pytest.approx(1.0)  # cosine starts at peak where warmup ended
    while clock() + 1.0 <= b.training_end():
        clock.advance(1.0)
        b.observe_step(1.0, 4)
        factors.append(lr.factor(b.global_step))
    after = factors[10:]
    assert all(x >= y for x, y in zip(after, after[1:], strict=False))
    clock.t = b.training_end()
    assert lr.progress() == 1.0
    assert lr.factor(b.global_step) == 0.05  # exactly the minimum at progress 1
    clock.advance(5.0)
    assert lr.factor(b.global_step) == 0.05  # constant after
    # Midway (in progress since warmup ended) the cosine is halfway between peak and minimum.
    start = lr.decay_start
    clock2 = FakeClock(0.0)
    b2 = Budget(1000, 0.0, clock=clock2)
    b2.start_training()
    lr2 = BudgetLR(b2, warmup_steps=0)
    lr2.decay_start = start
    clock2.t = (start + (1 - start) / 2) * 990.0
    assert lr2.factor(10**6) == pytest.approx(0.525)


def test_a_faster_measured_save_does_not_raise_the_learning_rate_again():
    # The save was estimated at 100 s (from the model size) and measured at 5 s: the training end moves
    # later, so the time-based progress would drop; the LR must not climb back during the decay.
    clock = FakeClock(0.0)
    b = Budget(1000, 0.0, clock=clock, benchmark_skip_steps=0)
    b.set_estimates(save_seconds=100.0)
    lr = BudgetLR(b, warmup_steps=0)
    b.start_training()
    assert lr.factor(b.global_step) == 1.0  # the cosine starts here
    run_steps(b, clock, 400, seconds=1.0, samples=4)
    before = lr.factor(b.global_step)
    assert before < 0.9
    b.observe_save(5.0)
    assert b.training_end() > 900  # the window grew by 95 s
    assert lr.factor(b.global_step) <= before


def test_lr_reaches_min_at_deadline_despite_drift():
    clock = FakeClock(0.0)
    b = Budget(2000, 0.0, clock=clock, benchmark_skip_steps=1)
    b.set_estimates(eval_seconds=30.0, save_seconds=30.0)
    lr = BudgetLR(b, warmup_steps=20)
    clock.advance(50.0)
    b.start_training()
    factors = []
    while not b.should_stop():
        d = 1.0 if b.global_step < 300 else 3.0  # throughput drops threefold
        clock.advance(d)
        b.observe_step(d, 8)
        factors.append(lr.factor(b.global_step))
        if b.global_step == 400:  # measured costs differ from the estimates: the horizon end moves
            clock.advance(10.0)
            b.observe_eval(10.0)
            clock.advance(45.0)
            b.observe_save(45.0)
    after = factors[20:]
    assert all(x >= y for x, y in zip(after, after[1:], strict=False))
    assert factors[-1] == pytest.approx(0.05, abs=0.005)
    clock.t = b.training_end()
    assert lr.factor(b.global_step) == 0.05


def test_warmup_is_capped_from_the_first_estimate_then_by_the_plan():
    clock = FakeClock(0.0)
    b = Budget(3600, 0.0, clock=clock, benchmark_samples=64, benchmark_skip_steps=1)
    lr = BudgetLR(b, warmup_steps=5000, max_warmup_fraction=0.1)
    b.start_training()
    run_steps(b, clock, 1, seconds=5.0, samples=16)  # a slow warm-up step sets no cap (it would be ~10x low)
    assert lr.effective_warmup_steps == 5000 and not lr.warmup_capped and lr.warmup_message() is None
    run_steps(b, clock, 1, seconds=0.5, samples=16)  # the first measured step: ~7,000 steps fit
    first_cap = lr.effective_warmup_steps
    assert 600 < first_cap < 720 and lr.warmup_capped
    assert "optimizer steps estimated before the plan)" in lr.warmup_message()  # not "planned" yet
    assert lr.factor(b.global_step) == pytest.approx((b.global_step + 1) / first_cap)
    run_steps(b, clock, 3, seconds=0.5, samples=16)
    assert b.benchmark_done()
    plan = b.plan(3200, 16)
    assert lr.effective_warmup_steps == int(0.1 * plan.optimizer_steps) <= first_cap
    assert lr.warmup_capped
    msg = lr.warmup_message()
    assert msg is not None and "5,000" in msg and f"{lr.effective_warmup_steps:,}" in msg
    assert f"{b.planned_horizon_steps:,} planned optimizer steps" in msg
    # A later replan does not move the cap.
    run_steps(b, clock, 200, seconds=1.0, samples=16)
    b.replan()
    assert lr.effective_warmup_steps == int(0.1 * plan.optimizer_steps)
    assert BudgetLR(b, warmup_steps=10).warmup_message() is None


@pytest.mark.parametrize(
    ("max_steps", "said"),
    [
        (12, "warmup: 1 step (--warmup_steps 500, at most 10% of the 12 optimizer steps of --max_steps)"),
        (
            1,
            "warmup: 0 steps (--warmup_steps 500, at most 10% of the 1 optimizer step of --max_steps): "
            "no warmup, --warmup_steps has no effect in so short a run",
        ),
        (
            4,
            "warmup: 0 steps (--warmup_steps 500, at most 10% of the 4 optimizer steps of --max_steps): "
            "no warmup, --warmup_steps has no effect in so short a run",
        ),
    ],
)
def test_a_warmup_of_one_step_is_said_in_the_singular(max_steps, said):
    """--max_steps 12 printed "warmup: 1 steps"."""
    b = Budget(9.5 * 3600, 0.0, clock=FakeClock(0.0))
    lr = BudgetLR(b, warmup_steps=500, max_steps=max_steps)
    b.start_training()
    assert lr.warmup_message() == said


def test_a_run_ended_by_max_steps_warms_up_and_decays_within_them():
    """--max_steps 20 inside a 9.5 h budget: the warmup was capped by the 9.5 h plan (26 of 260 steps
    estimated, more than the run had) and the cosine followed the clock, so the run ended at its peak
    LR. The horizon ends at --max_steps when it comes first: warmup 2 steps, the minimum at step 20."""
    clock = FakeClock(0.0)
    b = Budget(9.5 * 3600, 0.0, clock=clock)
    lr = BudgetLR(b, warmup_steps=500, max_steps=20)
    b.start_training()
    assert lr.effective_warmup_steps == 2  # known before any step
    # information, not a fault: README's own rehearsal command read "warmup capped: ... using 12"
    assert lr.warmup_message() == (
        "warmup: 2 steps (--warmup_steps 500, at most 10% of the 20 optimizer steps of --max_steps)"
    )
    factors = []
    for _ in range(20):
        factors.append(lr.factor(b.global_step))
        run_steps(b, clock, 1, seconds=1.0, samples=8)
    assert factors[:2] == [0.5, 1.0]  # warmup
    assert all(x > y for x, y in zip(factors[2:], factors[3:], strict=False))  # then down every step
    assert factors[-1] < 0.1 and lr.factor(b.global_step) == pytest.approx(0.05)  # the minimum at step 20
    # a resumed session continues to the same --max_steps: its own steps are the horizon
    b2 = Budget(9.5 * 3600, 0.0, clock=FakeClock(0.0))
    b2.global_step = 10
    lr2 = BudgetLR(b2, warmup_steps=500, max_steps=20)
    b2.start_training()
    run_steps(b2, b2.clock, 5, seconds=1.0, samples=8)
    assert lr2.progress() == pytest.approx(0.5)
    # without --max_steps the clock alone: 20 s of 9.5 h is no progress
    assert BudgetLR(b, warmup_steps=0).progress() < 0.01


def test_total_hours_across_two_sessions():
    total, target = 1600.0, 1000.0
    clock = FakeClock(0.0)
    b1 = Budget(target, 0.0, total_seconds=total, clock=clock, benchmark_skip_steps=1)
    lr1 = BudgetLR(b1, warmup_steps=2000, max_warmup_fraction=0.5)
    clock.advance(10.0)
    b1.start_training()
    run_steps(b1, clock, 40, seconds=1.0, samples=8)
    b1.plan(800, 8)  # ~1,570 steps over the horizon: warmup capped to half of that
    warmup = lr1.effective_warmup_steps
    assert 700 < warmup < 800
    # Session 1 is killed mid-warmup, right after a checkpoint.
    run_steps(b1, clock, 600, seconds=1.0, samples=8)
    f1 = lr1.factor(b1.global_step)
    assert f1 == pytest.approx((640 + 1) / warmup)
    p1 = lr1.progress()
    assert p1 == pytest.approx(650 / total)
    state, lr_state = b1.state_dict(), lr1.state_dict()
    assert state["spent_seconds"] == pytest.approx(650.0) and state["global_step"] == 640

    # Session 2: a new process an hour later.
    clock2 = FakeClock(10_000.0)
    b2 = Budget(target, 10_000.0, total_seconds=total, clock=clock2, benchmark_skip_steps=1)
    b2.load_state_dict(state)
    lr2 = BudgetLR(b2, warmup_steps=2000, max_warmup_fraction=0.5)
    lr2.load_state_dict(lr_state)
    assert lr2.effective_warmup_steps == warmup  # the cap belongs to the horizon
    assert lr2.progress() == pytest.approx(p1)  # progress continues where session 1 left it
    assert lr2.factor(b2.global_step) == pytest.approx(f1)  # no warmup restart
    assert b2.average_step_seconds() == pytest.approx(1.0)  # the prior until re-measured
    clock2.advance(10.0)
    b2.start_training()
    factors = []
    while not b2.should_stop():
        clock2.advance(1.0)
        b2.observe_step(1.0, 8)
        factors.append(lr2.factor(b2.global_step))
    assert factors[: warmup - 641] == pytest.approx([(k + 1) / warmup for k in range(641, warmup)])
    after = factors[warmup - 641 :]
    assert after[0] == pytest.approx(1.0, abs=1e-3)
    assert all(x >= y for x, y in zip(after, after[1:], strict=False))
    # The rest of the total (950 s) ends within session 2's 1000 s: LR at the minimum by the end.
    assert factors[-1] == pytest.approx(0.05, abs=1e-3)
    assert lr2.horizon_warning() is not None  # the total ends before this session's training would


def test_total_hours_last_session_reaches_min_despite_shortfall():
    # Two sessions sized for a total of 2x target, each ending a little early: the second is the last.
    total, target = 2000.0, 1000.0
    clock = FakeClock(0.0)
    b = Budget(target, 0.0, total_seconds=total, clock=clock)
    b.load_state_dict({"spent_seconds": 985.0, "global_step": 900})
    lr = BudgetLR(b, warmup_steps=10)
    b.start_training()
    assert lr.horizon_warning() is None
    clock.t = b.training_end()
    assert lr.progress() == 1.0 and lr.factor(b.global_step) == 0.05


def test_total_already_spent():
    clock = FakeClock(0.0)
    b = Budget(1000, 0.0, total_seconds=3600, clock=clock)
    b.load_state_dict({"spent_seconds": 4000.0, "global_step": 5000})
    lr = BudgetLR(b, warmup_steps=100)
    lr.load_state_dict({"decay_start": 0.01})
    assert lr.progress() == 1.0
    assert lr.factor(b.global_step) == 0.05
    assert "already spent" in (lr.horizon_warning() or "")


def test_without_total_each_session_is_its_own_horizon():
    clock = FakeClock(0.0)
    b = Budget(1000, 0.0, clock=clock)
    b.load_state_dict({"spent_seconds": 4000.0, "global_step": 5000})
    lr = BudgetLR(b, warmup_steps=100)
    lr.load_state_dict({"decay_start": 0.7})
    assert lr.decay_start is None and lr.progress() == 0.0
    assert lr.factor(b.global_step) == 1.0  # warmup already done in an earlier session: straight to peak
    assert lr.horizon_warning() is None


def test_without_total_the_previous_sessions_plan_does_not_cap_this_sessions_warmup():
    # Session 1 (no --total_hours) planned 500 steps, capping --warmup_steps 1000 to 50, and was stopped at
    # step 20. Session 2 has 10 hours: its own horizon caps the warmup, not session 1's.
    clock = FakeClock(0.0)
    b = Budget(36000, 0.0, clock=clock, benchmark_skip_steps=0, benchmark_samples=8)
    b.load_state_dict({"spent_seconds": 100.0, "global_step": 20, "planned_horizon_steps": 500})
    assert b.planned_horizon_steps is None
    lr = BudgetLR(b, warmup_steps=1000)
    b.start_training()
    run_steps(b, clock, 2, seconds=1.0, samples=4)
    assert lr.effective_warmup_steps == 1000  # the first steps' estimate: ~35,000 steps
    b.plan(4000, 4)
    assert b.planned_horizon_steps > 10_000
    assert lr.effective_warmup_steps == 1000 and not lr.warmup_capped
    assert lr.factor(b.global_step) == pytest.approx((b.global_step + 1) / 1000)


def test_the_warmup_cap_estimated_before_the_plan_never_rises():
    # A slow first measured step, then faster ones: the estimated horizon would grow, raising the cap and
    # dropping the learning rate mid-warmup. The cap is only ever lowered, so the LR never goes down.
    clock = FakeClock(0.0)
    b = Budget(3600, 0.0, clock=clock, benchmark_skip_steps=1, benchmark_samples=10_000)
    lr = BudgetLR(b, warmup_steps=5000, max_warmup_fraction=0.1)
    b.start_training()
    run_steps(b, clock, 1, seconds=5.0, samples=16)  # warm-up step: no cap yet
    caps, factors = [], []
    for seconds in [2.0, 0.5, 0.5, 0.5, 0.5]:
        run_steps(b, clock, 1, seconds=seconds, samples=16)
        caps.append(lr.effective_warmup_steps)
        factors.append(lr.factor(b.global_step))
    assert not b.benchmark_done()
    assert caps[0] < 5000 and caps == sorted(caps, reverse=True)
    assert factors == sorted(factors)


def test_state_dict_round_trip_priors():
    b, clock = make_benchmarked()
    b.observe_eval(12.0)
    b.observe_save(7.0)
    b.observe_export(33.0)
    state = b.state_dict()
    b2 = Budget(3600, 0.0, clock=FakeClock(0.0))
    b2.load_state_dict(state)
    assert b2.samples_per_second() == pytest.approx(b.samples_per_second())
    assert b2.average_step_seconds() == pytest.approx(b.average_step_seconds())
    assert (b2.eval_seconds(), b2.save_seconds(), b2.export_seconds()) == pytest.approx((12.0, 7.0, 33.0))
    b2.set_estimates(save_seconds=3.0)
    assert b2.save_seconds() == 7.0  # conservative between prior and estimate until measured
    with pytest.raises(ValueError):
        b2.load_state_dict({"version": 99})


def test_a_checkpoint_of_warmup_steps_only_keeps_the_next_session_from_a_step_it_cannot_finish():
    # saved during the warm-up steps (none measured yet): the fastest of them is the next session's step
    clock = FakeClock(0.0)
    b = Budget(3600, 0.0, clock=clock)
    run_steps(b, clock, 2, 40.0, 32)
    b.observe_step(30.0, 32)  # not yet: the 2 default warm-up steps are over, this one is measured
    measured = b.state_dict()["step_seconds"]
    b2 = Budget(3600, 0.0, clock=FakeClock(0.0))
    run_steps(b2, FakeClock(0.0), 2, 40.0, 32)
    assert b2.state_dict()["step_seconds"] == 40.0 and measured == pytest.approx(30.0)
    resumed = Budget(60, 0.0, clock=FakeClock(10.0))  # 50 s left: less than a 40 s step and its headroom
    resumed.load_state_dict(b2.state_dict())
    assert resumed.should_stop()


def test_a_short_warmup_step_stands_for_a_full_step_at_its_time_per_clip():
    # an epoch's last step of 4 clips among the warm-up steps: it stands for a 32-clip step at 10/4 s a clip
    clock = FakeClock(0.0)
    b = Budget(180, 0.0, clock=clock)
    clock.advance(40.0)
    b.observe_step(40.0, 32)
    clock.advance(10.0)
    b.observe_step(10.0, 4)
    assert b.median_step_seconds() == pytest.approx(40.0)  # min(40, 10 * 32 / 4): not the 10 s step
    assert b.state_dict()["step_seconds"] == pytest.approx(40.0)


def test_a_short_first_step_stands_for_a_full_step_before_any_full_one_ran():
    """A session whose first step is an epoch's short last one (a run resumed at that step) had only that
    step to go by: 4 clips in 10 s stood for the 32-clip steps, so with 30 s left it started a 40 s
    step and ended past its deadline. Scaled to the step's whole size it stands for 80 s."""
    clock = FakeClock(0.0)
    b = Budget(60, 0.0, clock=clock, full_step_samples=32)
    b.set_estimates(eval_seconds=5.0)
    clock.advance(10.0)
    b.observe_step(10.0, 4)
    assert b.median_step_seconds() == pytest.approx(80.0)  # 10 * 32 / 4, not 10
    assert b.state_dict()["step_seconds"] == pytest.approx(80.0)  # a checkpoint here keeps that too
    assert b.should_stop()  # 50 s left: no 40 s step fits, let alone this upper bound of one
    unknown = Budget(60, 0.0, clock=FakeClock(10.0))  # the step's size not given: the largest step seen
    unknown.observe_step(10.0, 4)
    assert unknown.median_step_seconds() == pytest.approx(10.0)


# ---- torch scheduler ------------------------------------------------------------------------------


def test_make_scheduler_round_trip():
    torch = pytest.importorskip("torch")
    total, target = 20_000.0, 1000.0  # not the last session: progress is spent / total in both sessions
    clock = FakeClock(0.0)
    b = Budget(target, 0.0, total_seconds=total, clock=clock)
    lr = BudgetLR(b, warmup_steps=5)
    param = torch.nn.Parameter(torch.zeros(2))
    opt = torch.optim.AdamW([param], lr=0.1)
    sched = make_scheduler(opt, lr)
    assert opt.param_groups[0]["lr"] == pytest.approx(0.1 / 5)
    b.start_training()
    for _ in range(30):
        clock.advance(1.0)
        opt.step()
        b.observe_step(1.0, 8)
        sched.step()
    lr_now = opt.param_groups[0]["lr"]
    assert lr_now == pytest.approx(0.1 * lr.factor(b.global_step))
    assert 0.05 * 0.1 < lr_now < 0.1
    states = (b.state_dict(), sched.state_dict(), opt.state_dict(), lr.state_dict())

    for optimizer_first in (False, True):
        clock2 = FakeClock(clock())  # a new process starting right now
        b2 = Budget(target, clock2(), total_seconds=total, clock=clock2)
        b2.load_state_dict(states[0])
        lr2 = BudgetLR(b2, warmup_steps=5)
        lr2.load_state_dict(states[3])
        param2 = torch.nn.Parameter(torch.zeros(2))
        opt2 = torch.optim.AdamW([param2], lr=0.1)
        if optimizer_first:
            opt2.load_state_dict(states[2])
            sched2 = make_scheduler(opt2, lr2)
        else:
            sched2 = make_scheduler(opt2, lr2)
            opt2.load_state_dict(states[2])
            sched2.load_state_dict(states[1])
        assert opt2.param_groups[0]["lr"] == pytest.approx(lr_now)
        assert sched2.base_lrs == pytest.approx([0.1])
        # Both continue identically from here.
        clock.advance(1.0)
        clock2.advance(1.0)
        opt.step()
        opt2.step()
        b.observe_step(1.0, 8)
        b2.observe_step(1.0, 8)
        sched.step()
        sched2.step()
        assert opt2.param_groups[0]["lr"] == pytest.approx(opt.param_groups[0]["lr"])
        assert sched2.get_last_lr() == pytest.approx(sched.get_last_lr())


def test_a_new_peak_applies_to_the_very_next_step():
    # A recovery halves the peak after reloading a checkpoint whose optimizer state holds the old LR: the
    # step right after it (the one most at risk of going non-finite again) must already use the new one.
    torch = pytest.importorskip("torch")
    clock = FakeClock(0.0)
    b = Budget(1000, 0.0, clock=clock, benchmark_skip_steps=0)
    lr = BudgetLR(b, warmup_steps=100)
    param = torch.nn.Parameter(torch.zeros(2))
    opt = torch.optim.AdamW([param], lr=0.1)
    sched = make_scheduler(opt, lr)
    b.start_training()
    for _ in range(10):
        run_steps(b, clock, 1, seconds=1.0, samples=4)
        opt.step()
        sched.step()
    factor = lr.factor(b.global_step)
    assert factor < 0.5  # still warming up
    assert opt.param_groups[0]["lr"] == pytest.approx(0.1 * factor)
    set_peak_lr([(opt, sched)], 0.05, lr)
    assert opt.param_groups[0]["initial_lr"] == 0.05
    assert opt.param_groups[0]["lr"] == pytest.approx(0.05 * factor)  # before any scheduler step
    run_steps(b, clock, 1, seconds=1.0, samples=4)
    opt.step()
    sched.step()
    assert opt.param_groups[0]["lr"] == pytest.approx(0.05 * lr.factor(b.global_step))


def test_lr_lambda_ignores_lambdalr_counter_and_follows_shared_progress():
    clock = FakeClock(0.0)
    b = Budget(1000, 0.0, clock=clock)
    lr = BudgetLR(b, warmup_steps=0)
    b.global_step = 10**6
    lr.share_progress(1.0)  # rank 0's progress, as multi-process runs broadcast it
    fn = lr_lambda_for(lr)
    assert fn(0) == fn(123) == 0.05


def run_until_stop(b: Budget, clock: FakeClock, durations) -> list[float]:
    """The loop's order: ask before every step (the first included), then run it; the steps' end times."""
    ends = []
    for seconds in durations:
        if b.should_stop():
            break
        clock.advance(seconds)
        b.observe_step(seconds, 8)
        ends.append(clock())
    return ends


def test_slow_first_steps_neither_overrun_nor_end_the_run_early():
    # The busy machine: 40 s of start-up, first steps of 31 and 10 s, then 2 s steps, 120 s budget.
    clock = FakeClock(0.0)
    b = Budget(120, 0.0, clock=clock, benchmark_skip_steps=2)
    b.observe_eval(3.0)
    b.set_estimates(save_seconds=2.0, export_seconds=2.0)
    clock.advance(40.0)
    b.start_training()
    ends = run_until_stop(b, clock, [31.0, 10.0] + [2.0] * 100)
    end = ends[-1] + b.final_reserve()
    assert len(ends) >= 10  # the 31 s step was not taken as typical
    assert 0.95 * 120 <= end <= 120  # and the run still ends inside its budget


def test_a_first_step_that_cannot_finish_is_not_started():
    # Before any step: the caller's estimate (scaled from the start evaluation) or a previous session's.
    clock = FakeClock(0.0)
    b = Budget(120, 0.0, clock=clock)
    b.observe_eval(5.0)
    b.set_estimates(save_seconds=2.0, export_seconds=2.0, step_seconds=30.0)
    clock.advance(40.0)
    assert not b.should_stop()  # 40 + 60 + 11 <= 120
    clock.advance(15.0)
    assert b.should_stop()
    # Without an estimate the first step is started (nothing says it cannot finish) ...
    b2 = Budget(120, 0.0, clock=clock)
    assert not b2.should_stop()
    # ... and one that took 60 s is not repeated when, as slow again, it would not leave the final reserve.
    b2.observe_step(60.0, 8)
    clock.t = 61.0
    assert b2.allowed_overrun_seconds() == 10.0
    assert b2.should_stop()


def test_a_step_far_slower_than_the_median_is_not_repeated_when_one_as_slow_would_overrun():
    # The machine became busy: one 30 s step after 1 s steps. The median (1 s) still says two more steps
    # fit; one as slow as the last would end the run past the deadline and its allowed overrun.
    clock = FakeClock(0.0)
    b = Budget(1000, 0.0, clock=clock, benchmark_skip_steps=0)
    b.observe_eval(5.0)
    b.observe_save(2.0)
    b.observe_export(3.0)
    run_steps(b, clock, 4, seconds=1.0, samples=4)
    run_steps(b, clock, 1, seconds=30.0, samples=4)
    assert b.median_step_seconds() == pytest.approx(1.0)
    overrun = b.allowed_overrun_seconds()
    assert overrun == 10.0
    slow_limit = b.deadline() + overrun - 30.0 - b.final_reserve()  # a 30 s step started later overruns
    clock.t = slow_limit - 1e-3
    assert not b.should_stop()
    clock.t = slow_limit + 1e-3
    assert clock() + 2 * b.median_step_seconds() + b.final_reserve() < b.deadline()  # the median's rule: go
    assert b.should_stop()


@pytest.mark.parametrize("outlier_at", [5, 40, 100])
def test_one_outlier_step_does_not_move_the_end(outlier_at):
    # 1 s steps with one 8 s step somewhere: the run ends where it would have without it (within a step).
    def end_with(outlier: bool) -> float:
        clock = FakeClock(0.0)
        b = Budget(120, 0.0, clock=clock, benchmark_skip_steps=1)
        b.observe_eval(2.0)
        b.start_training()
        steps = [1.0] * 200
        if outlier:
            steps[outlier_at] = 8.0
        ends = run_until_stop(b, clock, steps)
        return ends[-1] + b.final_reserve()

    assert end_with(True) == pytest.approx(end_with(False), abs=1.5)
    assert end_with(True) <= 120


def test_lr_schedule_state_carries_the_cosine_start_across_sessions():
    total, target = 4000.0, 1000.0
    clock = FakeClock(0.0)
    b1 = Budget(target, 0.0, total_seconds=total, clock=clock, benchmark_skip_steps=1)
    lr1 = BudgetLR(b1, warmup_steps=10)
    b1.start_training()
    for _ in range(200):
        run_steps(b1, clock, 1, seconds=1.0, samples=8)
        f1 = lr1.factor(b1.global_step)  # the scheduler asks after every step
    assert lr1.decay_start is not None and f1 < 1.0  # past warmup, on the cosine
    assert "lr_decay_start" not in b1.state_dict()  # the budget keeps time, the schedule its own state

    clock2 = FakeClock(50_000.0)
    b2 = Budget(target, 50_000.0, total_seconds=total, clock=clock2)
    b2.load_state_dict(b1.state_dict())
    lr2 = BudgetLR(b2, warmup_steps=10)
    lr2.load_state_dict(lr1.state_dict())
    assert lr2.decay_start == lr1.decay_start
    assert lr2.factor(b2.global_step) == pytest.approx(f1, abs=1e-3)  # no jump back to the peak


def test_reserve_after_loop_moves_the_training_end_and_is_kept_from_the_final_evaluation():
    b = Budget(1000, 0.0, clock=FakeClock(0.0))
    end, final_eval = b.training_end(), b.time_for_final_eval()
    b.reserve_after_loop(30.0)
    assert b.training_end() == pytest.approx(end - 30.0)
    # an upload after the export is not the final evaluation's to use when the last steps ran late
    assert b.time_for_final_eval() == pytest.approx(final_eval - 30.0)


def test_the_warmup_cap_is_reported_again_only_when_the_cap_changes():
    from types import SimpleNamespace

    from vits_trainer.training.loop import Trainer

    lines = []
    lr = SimpleNamespace(effective_warmup_steps=2, planned=23)
    lr.warmup_message = lambda: (
        f"warmup capped: {lr.planned} planned steps; using {lr.effective_warmup_steps}"
    )
    trainer = SimpleNamespace(
        s=SimpleNamespace(budget_lr=lr, log=lines.append), warmup_reported=None, resumed_from_step=None
    )
    Trainer.report_warmup_cap(trainer)
    lr.planned = 22  # a re-plan: another step count, the same cap
    Trainer.report_warmup_cap(trainer)
    lr.planned, lr.effective_warmup_steps = 50, 5
    Trainer.report_warmup_cap(trainer)
    assert lines == ["warmup capped: 23 planned steps; using 2", "warmup capped: 50 planned steps; using 5"]
    # a session resumed after the warmup ended: the first session's cap is no news
    trainer.warmup_reported, trainer.resumed_from_step = None, 57
    Trainer.report_warmup_cap(trainer)
    assert len(lines) == 2 and trainer.warmup_reported == 5


def test_a_replan_that_moves_the_step_count_says_so():
    """Each epoch re-plans from the measured speed; one that moves the session's steps by more than a
    quarter from the plan last printed gets a `replan:` line and record (42 steps planned after a
    benchmark on a busy machine, 101 run, and the log never said so); small moves stay quiet."""
    from types import SimpleNamespace

    from vits_trainer.training.budget import Plan
    from vits_trainer.training.loop import Trainer

    lines, records, totals = [], [], []
    trainer = SimpleNamespace(
        s=SimpleNamespace(log=lines.append, budget=SimpleNamespace(global_step=20)),
        metrics=SimpleNamespace(write=records.append),
        resumed_from_step=None,
        announced_steps=42,
        progress=SimpleNamespace(set_total=lambda total, done: totals.append((total, done))),
    )
    trainer.publish_plan = lambda plan, event: Trainer.publish_plan(trainer, plan, event)

    def plan(steps: int) -> Plan:
        return Plan(
            4.3, 60.0, 2.4, 2, 18, steps, steps, 1_000_600.0, 1_000_700.0, 120.0, 5, 5, 5, 2, 1_000_000.0
        )

    Trainer.announce_replan(trainer, plan(48))  # within a quarter: no news
    assert lines == [] and records == [] and trainer.announced_steps == 42
    Trainer.announce_replan(trainer, plan(101))
    assert len(lines) == 1
    assert lines[0].startswith(
        "replan: 101 steps this session (planned 42) at ~4.3 samples/s, training ends ~"
    )
    assert records[0]["event"] == "replan" and records[0]["optimizer_steps"] == 101 and totals == [(101, 20)]
    assert trainer.announced_steps == 101


def test_with_several_processes_rank_0_keeps_its_own_clock_and_the_others_follow_it(monkeypatch):
    """Every rank sets the LR from rank 0's progress and warmup cap, broadcast with each stop decision.
    Rank 0 itself must go on reading its clock: once it took the broadcast value as its own, it sent back
    that first value forever, and the LR of every multi-process run stayed at its peak after warmup. The
    warmup cap travels too: each rank planned its own from its own timings (230 against 227 steps). They
    travel in one sum over the ranks, the other ranks sending zeros (and their signal flag)."""
    from types import SimpleNamespace

    import accelerate.utils
    import torch

    from vits_trainer.training.loop import Trainer

    sent = []

    def reduce(packet, reduction):  # the sum every rank receives: rank 0's packet, the others' zeros
        assert reduction == "sum"
        sent.append(packet.tolist())
        return packet if not sent_by_rank0 else packet + torch.tensor(sent_by_rank0[-1])

    monkeypatch.setattr(accelerate.utils, "reduce", reduce)

    def rank(is_main: bool):
        clock = FakeClock(0.0)
        b = Budget(1000, 0.0, clock=clock)
        b.start_training()
        session = SimpleNamespace(
            is_main=is_main,
            budget=b,
            budget_lr=BudgetLR(b, warmup_steps=0),
            cfg=SimpleNamespace(max_steps=0),
            accelerator=SimpleNamespace(num_processes=2),
            device=torch.device("cpu"),
        )
        return SimpleNamespace(s=session, budget_stop=None, signals=SimpleNamespace(received=None)), clock

    sent_by_rank0: list = []
    main, clock = rank(True)
    progress = []
    for _ in range(3):
        clock.advance(200.0)
        Trainer.stop_decision(main)
        progress.append(sent[-1][2])
    assert progress[0] < progress[1] < progress[2]  # was 0.2, 0.2, 0.2
    assert main.s.budget_lr.progress() == pytest.approx(progress[2])  # the value it sent, as the others

    sent_by_rank0.append([0.0, 0.0, 0.5, 7.0, 0.0])
    other, _ = rank(False)  # its own clock says 0, its own warmup 0: it follows rank 0's 0.5 and 7
    Trainer.stop_decision(other)
    assert other.s.budget_lr.progress() == 0.5 and other.s.budget_lr.effective_warmup_steps == 7


def test_the_first_step_estimate_is_one_process_step_whatever_the_process_count():
    """Before the first step, the start evaluation's time per clip stands for a training sample's. Each
    process evaluates every clip and trains its own clips beside the others: a step of 8 clips per
    process takes 8 clips' time on 1 process or 2 (it was counted 16 with 2: 2x too slow a guess, which
    could skip the micro-batch trial or refuse the first step)."""
    from types import SimpleNamespace

    from vits_trainer.training.outputs import RunOutputs

    estimates = []
    for processes in (1, 2):
        outputs = RunOutputs.__new__(RunOutputs)
        outputs.s = SimpleNamespace(
            data=SimpleNamespace(val_sets={"val": [0] * 10}),
            budget=SimpleNamespace(
                eval_seconds=lambda: 5.0, set_estimates=lambda step_seconds: estimates.append(step_seconds)
            ),
            accelerator=SimpleNamespace(num_processes=processes),
        )
        outputs.estimate_step_from_eval(8)
    assert estimates == [pytest.approx(4.0), pytest.approx(4.0)]  # 0.5 s a clip, 8 clips


def test_a_plan_ending_within_minutes_gives_its_ends_to_the_second():
    """The 2-minute demo's plan read "training ends ~06:49, run ends ~06:49": the 9 s between them, and
    whether the run ends this minute or the next, were lost to the minute."""
    from vits_trainer.training.budget import hhmm

    now = time.mktime((2026, 11, 28, 6, 48, 30, 0, 0, -1))
    assert hhmm(now + 79, now) == "06:49:49" and hhmm(now + 88, now) == "06:49:58"
    assert hhmm(now + 3600, now) == "07:48"  # a long run's end: minutes are enough


def test_a_resumed_session_without_total_says_its_learning_rate_starts_again():
    # a user resuming "for more training" saw val_mel worsen at once: the LR went from its minimum back
    # to the peak, and no line said so
    b = Budget(1000, 0.0, clock=FakeClock(0.0))
    b.load_state_dict({"spent_seconds": 4000.0, "global_step": 5000})
    note = BudgetLR(b, warmup_steps=100).horizon_note(2e-4)
    assert note and "0.0002" in note and "--total_hours" in note
    assert BudgetLR(Budget(1000, 0.0, clock=FakeClock(0.0)), warmup_steps=100).horizon_note(2e-4) is None
    spanned = Budget(1000, 0.0, total_seconds=9000, clock=FakeClock(0.0))
    spanned.load_state_dict({"spent_seconds": 4000.0, "global_step": 5000})
    assert BudgetLR(spanned, warmup_steps=100).horizon_note(2e-4) is None  # one schedule across sessions


def test_the_session_gives_the_budget_a_whole_steps_samples(tmp_path, tiny_model_dir, tone_corpus):
    """--batch_size x --gradient_accumulation_steps x processes, or the epoch when it is smaller."""
    from tests.helpers import tiny_config
    from vits_trainer.training.session import build_session

    cfg = tiny_config(tmp_path, tone_corpus, tiny_model_dir, gradient_accumulation_steps=2)
    assert build_session(cfg, time.time()).budget.full_step_samples == 16
    cfg = tiny_config(tmp_path / "small", tone_corpus, tiny_model_dir, max_samples=12, val_fraction=0.0)
    cfg.gradient_accumulation_steps = 2
    assert build_session(cfg, time.time()).budget.full_step_samples == 12


def test_the_total_hours_warning_gives_the_value_the_flag_had():
    """--total_hours 0.005 was echoed as '--total_hours 0.01' (two decimals): a flag the user never gave."""
    b = Budget(36.0, 0.0, total_seconds=18.0, clock=FakeClock(0.0))
    assert (BudgetLR(b, warmup_steps=10).horizon_warning() or "").startswith(
        "--total_hours 0.005 ends before"
    )
    b = Budget(1000, 0.0, total_seconds=18.0, clock=FakeClock(0.0))
    b.load_state_dict({"spent_seconds": 40.0, "global_step": 50})
    assert (BudgetLR(b, warmup_steps=10).horizon_warning() or "").startswith(
        "--total_hours 0.005 is already spent (0.0111 h)"
    )


def test_a_budget_is_shown_as_its_flag_was_given():
    """The plan said "(budget 0.01 h)" for --target_hours 0.015: two decimals, a budget never given."""
    from vits_trainer.training.budget import hours

    assert [hours(h * 3600) for h in (0.015, 9.5, 1.0, 0.1)] == ["0.015 h", "9.5 h", "1 h", "0.1 h"]
