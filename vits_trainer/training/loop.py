"""The training loop shared by train_vits.py and train_feedback.py.

One optimiser step = `gradient_accumulation_steps` loader batches (fewer at the end of an epoch), run as
micro-batches of the size the micro-batch trial chose (microbatch_choice.py): the same clips per step whatever
the size. Those loader batches are the step's *cycle* (`pending` while it is gathered). One step, from
the top down: `train_step` (the step and its bookkeeping) -> `step_with_retries` (the cycle redone after
an out-of-memory error or a failed compiled step) -> `run_micro_batches` (one attempt: the cycle cut into
micro-batches) -> `GanStep.micro_step` (step.py: forward, backward, and after the last the optimisers).
After each step the budget is told how long it took; once the benchmark samples are measured the
run is planned, and from then on it re-plans each epoch and stops at the last step boundary after
which the final evaluation, checkpoint and export still fit before the deadline. Evaluations and
checkpoints in between happen at epoch ends, each when it costs at most 10 % of the time since the last
one (budget.OVERHEAD_SHARE) and still fits; a checkpoint also after any step once --save_minutes have
passed since the last one, if it fits. SIGINT/SIGTERM end the run the same way, minus the final
evaluation: finish the step, save, export, exit 0.
"""

from __future__ import annotations

import math
import os
import signal
import time
from dataclasses import dataclass, field

import torch

from ..data.loader import HOST_ONLY_KEYS, move_batch
from ..model.triton_support import triton_problem
from .agreement import Agreement
from .budget import hhmm, hours
from .compile_choice import CompileChoice
from .cpushare import cpu_share
from .microbatch import micro_batches
from .microbatch_choice import MicroBatchPolicy, is_out_of_memory
from .outputs import RunOutputs
from .recovery import Recovery
from .reporting import MetricsLog, Progress
from .run_end import RunEnd
from .runtime import describe_threads, thread_report
from .session import Session
from .step import GanStep

LOG_SECONDS = 60.0  # a metric line at least this often, so a run of slow steps never looks hung
REPLAN_NEWS = 0.25  # a re-plan moving the session's steps by more than this share gets a log line
# what may end the loop (None: nothing yet); train_summary.json's stopped_reason is one of them or "end",
# and report.STOP_WORDS says each in words
STOP_REASONS = (None, "budget", "signal", "max_steps")
# under `accelerate launch` a Ctrl-C (the process group's signal) reaches each worker twice within
# milliseconds: directly, and forwarded by the launcher; a repeat this soon is that same stop
REPEAT_GRACE_SECONDS = 2.0


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
        s.log,
    )


class SignalStop:
    """First SIGINT/SIGTERM: finish the step, save, exit 0. Second: exit at once. Installed until the
    run's end is done: a signal during the final evaluation, save or export (`ending`) lets them finish,
    where Python's default would abandon the last steps' checkpoint half way. `repeat_grace`: seconds
    after the first signal in which another is the same stop delivered twice (several processes)."""

    def __init__(self, log, repeat_grace: float = 0.0):
        self.log = log
        self.repeat_grace = repeat_grace
        self.received: str | None = None
        self.received_at = 0.0
        self.ending = False  # the loop is over: the run's end (run_end.py) is under way
        self._previous = {}
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                self._previous[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread (e.g. called from a notebook worker)
                pass

    def _handle(self, signum, frame):
        name = signal.Signals(signum).name
        if self.received is not None:
            if time.monotonic() - self.received_at < self.repeat_grace:
                return  # the launcher's copy of the signal this process got from its group
            self.log(f"{name} again: exiting now without saving")
            os._exit(128 + signum)
        self.received, self.received_at = name, time.monotonic()
        doing = (
            "the run is ending: saving and exporting" if self.ending else "finishing this step, then saving"
        )
        self.log(f"{name} received: {doing} (send it again to exit at once)")

    def restore(self):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


@dataclass
class StepWindow:
    """What the steps since the last metric line added up to. Written by `run_epoch` (the loader's
    wait), `run_micro_batches` (a completed cycle's metrics) and `train_step` (the step's time and
    clips); read and replaced by a new one in `log_step`. The Trainer keeps one for the whole session
    too (`session_window`: its times and waits, for train_summary.json; the session's step count is
    `budget.session_steps`)."""

    samples: int = 0
    seconds: float = 0.0
    wait: float = 0.0  # waiting for the loader
    compiling: float = 0.0  # of `seconds`, the steps that compiled or recorded CUDA graphs
    # of `seconds` less `compiling`, the host waiting at the steps' read for the device's work (a compiling
    # step's time is the compiler's: neither the host's launches nor the GPU's work)
    device_wait: float = 0.0
    steps: int = 0
    sums: dict = field(default_factory=dict)  # per metric: the sum of its values (on the device)
    counts: dict = field(default_factory=dict)  # per metric: how many values that sum holds
    started: float = field(default_factory=time.perf_counter)

    def add_cycle(self, metrics: list[dict], clips: list[int]) -> None:
        """A completed cycle's metrics, one dict per micro-batch of `clips` clips: the losses come with
        each micro-batch, the gradient norms with the last one only. Each metric is a mean over the
        window's clips: a loss weighted by its micro-batch's clips (each is a mean over its own), a
        value of the step's by the step's."""
        total = sum(clips)
        cycle: dict = {}  # per metric: (clip-weighted sum, clips of the micro-batches that carry it)
        for values, n in zip(metrics, clips, strict=True):
            for k, v in values.items():
                weighted, carried = cycle.get(k, (0.0, 0))
                cycle[k] = (weighted + v.float() * n, carried + n)
        for k, (weighted, carried) in cycle.items():
            self.sums[k] = self.sums.get(k, 0.0) + weighted * (total / carried)
            self.counts[k] = self.counts.get(k, 0) + total

    def means(self) -> dict[str, float]:
        """Each metric's mean over the window, read from the device at once."""
        names = list(self.sums)
        sums = torch.stack([self.sums[k] for k in names]).tolist() if names else []  # one read
        return {k: v / self.counts[k] for k, v in zip(names, sums, strict=True)}

    def add_step(
        self, seconds: float, samples: int, compiling: bool = False, device_wait: float = 0.0
    ) -> None:
        self.samples += samples
        self.seconds += seconds
        self.steps += 1
        if compiling:
            self.compiling += seconds
        else:
            self.device_wait += device_wait

    def data_wait_fraction(self) -> float:
        """The loader's wait over the steps' time."""
        return self.wait / max(self.seconds, 1e-9)

    def device_wait_fraction(self) -> float | None:
        """The host's wait for the device's work over the steps' time, the compiling steps left out;
        None when every step compiled (or there was none)."""
        measured = self.seconds - self.compiling
        return self.device_wait / measured if measured > 0 else None


class Trainer:
    """One run of the loop over a built session, composed of parts that own their state:
    - `micro_batching` (microbatch_choice.MicroBatchPolicy): how many clips go through the networks at
      once (a local `micro` is that number);
    - `compiler` (compile_choice.CompileChoice): whether the step runs compiled;
    - `outputs` (outputs.RunOutputs): evaluations, checkpoints and exports along the way;
    - `recovery` (recovery.Recovery): skipped steps, and the way back from a run of them;
    - `run_end` (run_end.RunEnd): the final evaluation, export and train_summary.json;
    - `agreement` (agreement.Agreement): rank 0's decisions on every rank.
    The Trainer itself is the loop: epochs, the optimiser steps in them, when to stop, what to log."""

    def __init__(self, session: Session):
        self.s = session
        cfg = session.cfg
        self.metrics = MetricsLog(session.checkpoint_dir / "metrics.jsonl", session.is_main)
        self.agreement = Agreement(session.accelerator)
        self.step_fn = gan_step(session)
        self.threads = thread_report()  # end_run adds the thread changes: the final checkpoint has them
        pinned = "OMP_NUM_THREADS" in (self.threads.get("set_by_user") or "")
        self.cpu_share = cpu_share(self.threads["torch_threads"], pinned)  # follows the machine's load
        self.threads["adaptive"] = self.cpu_share is not None
        self.micro_batching = MicroBatchPolicy(session, self.metrics, self.agreement)
        self.compiler = CompileChoice(
            cfg.compile,
            session.device.type,
            session.accelerator.num_processes,
            cfg.gradient_checkpointing,
            self.step_fn.use_compiled,
            session.log,
            checkpoint_dir=session.checkpoint_dir,
            gpu_problem=triton_problem(session.device) if session.device.type == "cuda" else None,
        )
        self.outputs = RunOutputs(session, self.metrics, self.agreement, self.checkpoint_figures)
        if session.resumed_from is not None:
            self.outputs.take_over_resumed()
        self.recovery = Recovery(session, self.metrics, lambda: self.outputs.last_checkpoint)
        self.run_end = RunEnd(session, self.outputs, self.agreement)
        self.batches_per_step = cfg.gradient_accumulation_steps  # loader batches; micro-batches may differ
        # every step of this session: its time, data and device waits (budget.session_steps counts them)
        self.session_window = StepWindow()
        # on a GPU: whether the host or the GPU limits the steps (on a CPU nothing queues: always ~0)
        self.reports_device_wait = session.device.type == "cuda"
        self.resumed_from_step = session.budget.global_step if session.resumed_from else None
        self.budget_stop: dict | None = None  # what the budget weighed when it ended the run
        self.warmup_reported: int | None = None  # the warmup cap (steps) the last line reported
        self.announced_steps: int | None = None  # the session's steps by the plan last printed
        self.window = StepWindow()
        # for the length of `train`: the SIGINT/SIGTERM handlers and the progress bar
        self.signals: SignalStop | None = None
        self.progress: Progress | None = None

    # ---- the loop --------------------------------------------------------------------------------

    def train(self) -> dict:
        s = self.s
        self.signals = SignalStop(s.log, REPEAT_GRACE_SECONDS if s.accelerator.num_processes > 1 else 0.0)
        try:  # the handlers before the run come back however it ends (a notebook goes on with them)
            self.progress = Progress(s.log, s.is_main, s.device, s.cfg.max_steps, s.budget.global_step)
            stop_reason = self.start_run()
            while stop_reason is None:
                stop_reason = self.run_epoch()
                if stop_reason is None:
                    stop_reason = self.end_epoch()
            if self.window.steps:  # the steps since the last metric line: else the curves end short of
                self.log_step(0)  # the run, and a run shorter than --log_every has none
            self.progress.close()
            self.say_no_plan(stop_reason)
            self.signals.ending = True
            return self.end_run(stop_reason)
        finally:
            self.signals.restore()
            # however the run ended, the next one may use the folder (raised too: a notebook's next run in
            # this process would be refused its own folder)
            if s.run_lock is not None:
                s.run_lock.release()

    def run_epoch(self) -> str | None:
        """The rest of the current epoch, one optimiser step per cycle of loader batches; the stop
        reason if the run ends inside it."""
        s, state = self.s, self.s.state
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
            self.session_window.wait += wait
            self.window.wait += wait
            cycle_start = (b // self.batches_per_step) * self.batches_per_step
            cycle_length = min(self.batches_per_step, n_batches - cycle_start)
            pending.append(batch)
            b += 1
            if b - cycle_start < cycle_length:
                continue  # the step's clips are gathered first, then cut into micro-batches
            stop_reason = self.train_step(pending, t_step, b, n_batches)
            pending = []
            if stop_reason:
                return stop_reason
            t_step = time.perf_counter()  # logging and saving are not part of the next step's time
        return None

    def train_step(self, pending: list[dict], t_step: float, position: int, n_batches: int) -> str | None:
        """One optimiser step on a cycle's loader batches (`pending`, ending at batch `position` of the
        epoch's `n_batches`), then its bookkeeping; the stop reason if the run ends here. The order matters
        twice: `measure_step` counts the step (`budget.global_step` is its number in every line and record
        after it), and the LR schedules step after the stop decision, which brings rank 0's LR progress."""
        s, state = self.s, self.s.state
        # the size being tried, read before the step: an out-of-memory error inside it can end the trial
        trial_size = self.micro_batching.trial.current() if self.micro_batching.trial is not None else None
        result, micro, clean = self.step_with_retries(pending)
        seconds = time.perf_counter() - t_step
        # the step's size, every rank's clips through the networks (whole, or an epoch's short last step)
        clips = sum(x["indices"].numel() for x in pending) * s.accelerator.num_processes
        # the epoch's samples it trained, every rank's, each once (with several processes, fewer than
        # `clips` at an epoch's end: some ranks repeat an earlier batch, or one's last batch is short)
        samples = s.sampler.samples_in(position - len(pending), position)
        compiling = self.measure_step(seconds, samples, clips, trial_size, micro, clean)
        stop_reason, save_now = self.stop_decision(self.outputs.interval_save_due())
        s.g_scheduler.step()  # after the decision: every rank now has the same LR progress
        s.d_scheduler.step()
        for window in (self.session_window, self.window):
            window.add_step(seconds, samples, compiling, result.device_wait)
        state.samples_seen += samples
        state.batch_in_epoch = position  # a checkpoint from here on resumes after this step
        self.recovery.after_step(result, pending)
        self.follow_load()
        self.plan_and_report(n_batches - position)
        # a stop saves anyway, at the end; none while steps are being skipped: weights that give non-finite
        # steps would push the last good checkpoints out of the kept ones (a finite step saves it)
        if save_now and not stop_reason and not state.consecutive_skips:
            self.outputs.save_checkpoint("interval")
        return stop_reason

    def measure_step(
        self, seconds: float, samples: int, clips: int, trial_size: int | None, micro: int, clean: bool
    ) -> bool:
        """A step's time to the budget (which counts the step: `budget.global_step`), to the micro-batch
        trial while it runs, or to the compile decision; that decision begins once the size is known.
        `samples`: the epoch's samples it trained (the budget's throughput and epochs); `clips`: what went
        through the networks, the step's size (the trial's and the compile decision's time per clip).
        Returns whether the step compiled (or recorded CUDA graphs): its time is mostly that."""
        budget = self.s.budget
        self.micro_batching.ran_at(micro)
        # a trial's steps count, but measure the run only once its size is chosen; compiling steps count,
        # but are not a step's time either
        measured, compiling = trial_size is None, False
        if measured and self.compiler.begun:
            measured = self.compiler.observe(seconds, clips, clean and self.micro_batching.is_full(clips))
            compiling = not measured
        budget.observe_step(seconds, samples, measured=measured)  # counts the step: global_step += 1
        # after observe_step: a trial that ends here hands the budget the steps it observed unmeasured
        if trial_size is not None and self.micro_batching.trial is not None:
            self.micro_batching.observe_trial_step(trial_size, seconds, clips, clean)
        if self.micro_batching.trial is None and not self.compiler.begun:
            self.begin_compile()
        return compiling

    def plan_and_report(self, batches_left: int) -> None:
        """The plan once the benchmark samples are measured, the warmup cap's line, and a metric line every
        --log_every steps (or LOG_SECONDS, whichever comes first)."""
        budget, cfg = self.s.budget, self.s.cfg
        if budget.current_plan is None and budget.benchmark_done():
            self.make_plan()
        if self.warmup_reported is None:
            self.report_warmup_cap()
        if (
            budget.global_step % cfg.log_every == 0
            or time.perf_counter() - self.window.started >= LOG_SECONDS
        ):
            self.log_step(batches_left)

    def step_with_retries(self, pending: list[dict]):
        """The cycle's forward/backward passes and optimiser step, redone after an out-of-memory error
        (smaller micro-batches) or a failed compiled step (a narrower compile scope, or eager), as often
        as a redo fails that way. (result, micro-batch size, clean: it ran once)."""
        micro, clean = self.micro_batching.size(), True
        while True:
            try:
                return self.run_micro_batches(pending, micro), micro, clean
            except Exception as err:
                out_of_memory = is_out_of_memory(err)
                if not out_of_memory and not self.compiler.backed_off_after(err):  # an eager step's error
                    raise
            # outside the except block, so that the failed cycle's frames and activations are freed
            self.step_fn.abandon_cycle()
            clean = False
            if out_of_memory:  # the same cycle in smaller micro-batches; else a narrower scope, or eager
                micro = self.micro_batching.smaller_after_oom(micro)

    def run_micro_batches(self, pending: list[dict], micro: int):
        """One attempt at the optimiser step: this cycle's loader batches as micro-batches of at most
        `micro` clips, the optimisers stepped after the last one."""
        s = self.s
        parts = micro_batches(pending, micro, s.pad)
        # each part's losses are means over its clips: weighted by its share of the cycle's clips, a cut
        # into unequal parts (an epoch's short batch, a size after an out-of-memory error) trains like one
        clips = [part["input_ids"].size(0) for part in parts]
        result, metrics = None, []
        for j, part in enumerate(parts):
            part = {k: v for k, v in part.items() if k not in HOST_ONLY_KEYS}
            part = move_batch(part, s.device)
            result = self.step_fn.micro_step(part, j == 0, j == len(parts) - 1, clips[j] / sum(clips))
            metrics.append(result.metrics)
        self.window.add_cycle(metrics, clips)  # only once the cycle completed: a redone cycle counts once
        return result

    # ---- the start and the end -------------------------------------------------------------------

    def start_run(self) -> str | None:
        """Before the first step: trackers, the start evaluation (a new run), the micro-batch choice;
        the stop reason when not even one step fits."""
        s, cfg, budget = self.s, self.s.cfg, self.s.budget
        started = time.time()
        if cfg.report_to != "none":
            s.accelerator.init_trackers("vits_trainer", config=_flat_config(cfg.to_dict()))
        s.log(describe_threads(self.threads))
        if s.resumed_from is None and s.val_loaders:
            self.outputs.warm_up_first_calls()
            self.follow_load(settle=True)  # timed at the count training starts with, not 2 on busy CPUs
            self.outputs.run_eval("start", export_best=False)  # baseline, and an eval time for the plan
            self.outputs.estimate_step_from_eval(self.micro_batching.clips_trained_per_step())
        warning = s.budget_lr.horizon_warning()
        if warning:
            s.log(f"warning: {warning}")
        budget.start_training()
        self.write_session_record(started)
        self.micro_batching.start()
        if self.micro_batching.trial is None:  # the micro-batch is known: compile now, or after the trial
            self.begin_compile()
        # asked before the first step too: a step that cannot finish before the deadline is not started
        stop_reason, _ = self.stop_decision()
        note = s.budget_lr.horizon_note(s.peak_lr)
        if note and stop_reason is None:  # a session that trains no step follows no schedule
            s.log(f"note: {note}")
        self.say_no_step(stop_reason)
        return stop_reason

    def say_no_step(self, stop_reason: str | None) -> None:
        """Why a session trains no step, when the stop decision before the first one ended it (a signal
        says its own)."""
        s, budget = self.s, self.s.budget
        if stop_reason == "budget":
            weighed = budget.stop_state()  # the step with its headroom: the figures the rule compared
            s.log(
                f"budget: no time for a training step ({weighed['seconds_left']:.0f} s left; a step needs "
                f"~{weighed['next_step_seconds']:.0f} s with its headroom, the final evaluation, save and "
                f"export ~{weighed['final_reserve_seconds']:.0f} s)"
            )
        elif stop_reason == "max_steps":  # a resumed run keeps the --max_steps its run was given
            s.log(
                f"max_steps: step {budget.global_step} is --max_steps {s.cfg.max_steps} already: no training "
                "step (--max_steps 0 lets the budget decide)"
            )

    def write_session_record(self, started: float) -> None:
        """Where this process's time went before training (report.html's timeline): its start, the
        start of the loop's set-up (`started`), training from now; resumed runs append a new one."""
        s, budget = self.s, self.s.budget
        self.metrics.write(
            {
                "event": "session",
                "step": budget.global_step,
                "time": time.time(),
                "process_start": budget.process_start,
                "started": started,
                "target_seconds": budget.target_seconds,
                "preload_seconds": s.preload_seconds,
                "resumed_from": self.resumed_from_step,
            }
        )

    def begin_compile(self) -> None:
        """The micro-batch size is fixed: the compile decision, with the eager figure the trial of this
        session measured for that size (if it ran one)."""
        left = self.s.budget.training_left()
        self.compiler.begin(left.seconds, self.micro_batching.trial_seconds_per_sample(), left.max_steps)

    def end_epoch(self) -> str | None:
        """An epoch ended: count it, re-plan, evaluate/save if due; the stop reason after that."""
        budget, state = self.s.budget, self.s.state
        state.epoch += 1
        state.batch_in_epoch = 0
        if budget.current_plan is not None:
            self.announce_replan(budget.replan())
        self.outputs.evaluate_and_save_if_due()
        stop_reason, _ = self.stop_decision()
        return stop_reason

    def end_run(self, stop_reason: str | None) -> dict:
        """After the last step: the end of the run (run_end.py), the thread setting restored; the summary
        (`train` then releases the run's lock)."""
        if self.cpu_share is not None:
            self.threads["thread_changes"] = self.cpu_share.changes
            self.threads["torch_threads_at_end"] = self.cpu_share.threads
        summary = self.run_end.finish(stop_reason, self.loop_figures())
        if self.cpu_share is not None and self.cpu_share.changes:  # the process's own setting again
            self.cpu_share.apply(self.cpu_share.max_threads)  # (a notebook goes on using it)
        return summary

    def session_rate(self) -> float:
        """Samples per second over every step of this session (the budget's own figure skips the warm-up
        steps)."""
        seconds = self.session_window.seconds
        return self.s.budget.session_samples / seconds if seconds else 0.0

    def checkpoint_figures(self) -> dict:
        """What the loop chose that each checkpoint records beside the session's state (read at each
        save): the thread settings and the micro-batch in use."""
        return {"threads": self.threads, **self.micro_batching.used()}

    def loop_figures(self) -> dict:
        """What the loop measured and chose, for train_summary.json."""
        return {
            "samples_per_second": self.session_rate(),
            "budget_stop": self.budget_stop,
            "resumed_from_step": self.resumed_from_step,
            "data_wait_fraction": self.session_window.data_wait_fraction(),
            # None too for a session of no step: it waited for nothing
            "device_wait_fraction": self.session_window.device_wait_fraction()
            if self.reports_device_wait
            else None,
            **self.checkpoint_figures(),
            "compile": self.compiler.summary(),
        }

    # ---- decisions and helpers ------------------------------------------------------------------

    def stop_decision(self, want_save: bool = False) -> tuple[str | None, bool]:
        """(stop reason, save now?) as the main process sees them (its clock, its signals), the same on
        every rank; in multi-process runs rank 0's LR progress and warmup cap travel along, and a signal
        any rank received stops them all (SIGTERM sent to one worker was ignored: the run trained on)."""
        s = self.s
        reason = None
        if s.is_main:
            if self.signals.received:
                reason = "signal"
            elif s.budget.should_stop():
                reason = "budget"
                self.budget_stop = s.budget.stop_state()
            elif s.budget.max_steps_reached():
                reason = "max_steps"
        code = STOP_REASONS.index(reason)  # a number, to travel to the other ranks
        if s.accelerator.num_processes > 1:
            from accelerate.utils import reduce

            lr = s.budget_lr  # rank 0's own figures (the value shared before would freeze them)
            # one sum over the ranks: rank 0's figures (the others send zeros), and how many got a signal
            figures = (
                [code, float(want_save), lr.own_progress(), lr.own_warmup_steps()] if s.is_main else [0] * 4
            )
            packet = torch.tensor([*figures, float(self.signals.received is not None)], device=s.device)
            code, save, lr_progress, warmup, signalled = reduce(packet, "sum").tolist()
            code, want_save = int(code), bool(save)
            lr.share_progress(lr_progress, int(warmup))  # every rank, rank 0 too: one LR for all
            if signalled and STOP_REASONS[code] != "signal":  # only another process got it (its handler's
                # line is not the main process's to print); the loop ends here, so this is said once
                s.log("a signal reached another process of the run: finishing this step, then saving")
                code = STOP_REASONS.index("signal")
        return STOP_REASONS[code], want_save

    def follow_load(self, settle: bool = False) -> None:
        """Fewer threads while other processes keep this run's CPUs busy, all of them again once they stop;
        `settle`: the one measurement before the start evaluation (CpuShare.settle)."""
        if self.cpu_share is None:
            return
        message = self.cpu_share.settle() if settle else self.cpu_share.poll()
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

    # ---- the plan's announcements: its lines and records (plan, replan, warmup cap, no plan) -------

    def make_plan(self) -> None:
        """The first plan, once the benchmark is done: its lines (the warmup cap's too) and `plan` record."""
        s = self.s
        rate = s.budget.samples_per_second()
        evals, saves = self.outputs.expected_per_epoch(s.data.samples_per_epoch / rate if rate > 0 else 0.0)
        plan = s.budget.plan(s.data.samples_per_epoch, self.micro_batching.effective_step_clips, evals, saves)
        s.log(plan.describe())
        self.report_warmup_cap()
        self.publish_plan(plan, "plan")

    def announce_replan(self, plan) -> None:
        """A re-plan that moves the session's step count by more than REPLAN_NEWS from the plan last
        announced gets a line and a `replan` record (a busy machine during the benchmark, then a quiet
        one: 42 steps planned, 101 run, and the log never said so)."""
        s, before = self.s, self.announced_steps
        if before is None or abs(plan.optimizer_steps - before) <= max(5, REPLAN_NEWS * before):
            return
        s.log(
            f"replan: {plan.optimizer_steps:,} steps this session (planned {before:,}) at "
            f"~{plan.samples_per_second:.1f} samples/s, training ends "
            f"~{hhmm(plan.train_end_wall, plan.created_wall)}"
        )
        self.publish_plan(plan, "replan")

    def publish_plan(self, plan, event: str) -> None:
        """A plan the log announced: the progress bar's total, its metrics record, the steps it said."""
        step = self.s.budget.global_step
        self.progress.set_total(plan.optimizer_steps + (self.resumed_from_step or 0), step)
        self.metrics.write({"event": event, "step": step, **plan.to_dict()})
        self.announced_steps = plan.optimizer_steps

    def report_warmup_cap(self) -> None:
        """The warmup cap's line: when the first estimate sets it, and again if the plan changes the cap
        (not for a new step count that leaves it as it was)."""
        message = self.s.budget_lr.warmup_message()
        cap = self.s.budget_lr.effective_warmup_steps
        if message and cap != self.warmup_reported:
            resumed_after_warmup = self.resumed_from_step is not None and self.resumed_from_step >= cap
            if not resumed_after_warmup:  # an earlier session's warmup is no news
                self.s.log(message)
            self.warmup_reported = cap

    def say_no_plan(self, stop_reason: str | None) -> None:
        """A session whose steps ended before the benchmark made a plan still gets a plan line (a slow
        run's log had none): what it trained and why. A signal says its own; no step: say_no_step said why."""
        s, budget = self.s, self.s.budget
        if budget.current_plan is not None or budget.session_steps == 0 or stop_reason == "signal":
            return
        if stop_reason == "max_steps":
            ended_by = f"--max_steps {s.cfg.max_steps:,}"
        else:
            ended_by = (
                f"the time budget ({hours(budget.target_seconds)}, of which the final evaluation, save "
                f"and export keep ~{budget.final_reserve():.0f} s)"
            )
        s.log(budget.no_plan_line(ended_by, self.session_rate()))

    # ---- metric lines ----------------------------------------------------------------------------

    def log_step(self, batches_left: int) -> None:
        """A metric line: the window's means to metrics.jsonl, the trackers and the progress bar."""
        s, window = self.s, self.window
        values = {k: (v if math.isfinite(v) else None) for k, v in window.means().items()}  # strict JSON
        values["samples_per_second"] = window.samples / max(window.seconds, 1e-9)
        values["data_wait_fraction"] = window.data_wait_fraction()
        if window.compiling:  # why samples/s dipped: those steps' time was mostly compilation
            values["compile_seconds"] = window.compiling
        device_wait = window.device_wait_fraction() if self.reports_device_wait else None
        if device_wait is not None:  # high: the GPU's work limits the steps; ~0: the host's launches
            values["device_wait_fraction"] = device_wait
        values["lr"] = s.g_optimizer.param_groups[0]["lr"]  # after the schedule stepped: the next step's
        values["skipped_steps"] = s.state.skipped_steps
        values["recoveries"] = s.state.recoveries
        record = {
            "step": s.budget.global_step,
            "epoch": s.state.epoch,
            "samples_seen": s.state.samples_seen,  # with `time`: the rate on the wall clock, logging included
            "time": time.time(),
            **values,
        }
        if s.device.type == "cuda":
            record["vram_gb"] = torch.cuda.max_memory_allocated(s.device) / 2**30
        self.metrics.write(record)
        if s.accelerator.trackers:
            s.accelerator.log(values, step=s.budget.global_step)
        epoch_eta = batches_left / self.batches_per_step * s.budget.average_step_seconds()
        self.progress.update(s.budget.global_step, values, s.budget, epoch_eta)
        self.window = StepWindow()  # the next line covers the steps from here


def _flat_config(config: dict) -> dict:
    return {k: (v if isinstance(v, int | float | str | bool) else str(v)) for k, v in config.items()}
