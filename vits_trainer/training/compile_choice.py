"""Whether the step runs compiled (--compile): decided from the device and the training time left,
then measured on real steps and undone when it does not pay.

Compiling costs time before it saves any: Dynamo traces the step's networks (model/compiled.py),
inductor generates kernels, CUDA graphs are recorded. That time is spent inside the budget like any
other, so:
- `auto` compiles only on CUDA, in a single process, without --gradient_checkpointing, and when at
  least COMPILE_MIN_MINUTES of training time are left after the micro-batch trial, counting both the
  budget and --max_steps (a run too short to earn compilation back stays eager). A CPU stays eager:
  CUDA graphs, the main gain, exist only on a GPU, and inductor's code generation takes minutes on a
  few cores. Neither `auto` nor `on` compiles for a GPU older than Triton, inductor's GPU compiler,
  supports (Kaggle's P100), or without Triton: the log says so before the first step.
- The scopes (TRIED, widest first) are compiled at once: the first COMPILE_STEPS compiled steps are
  the compilation (they train, but the budget does not take their time as a step's); so is a later
  step during which something compiled again (a new micro-batch size, a part meeting new lengths) or
  warmed up or recorded CUDA graphs for a new path of shapes (model/compiled.py), up to
  LATE_COMPILE_STEPS of them.
- Each scope's next MEASURE_STEPS steps are measured, the widest first, then each narrower one from
  the parts already compiled (on a GPU after SWITCH_STEPS steps taken as compilation: its CUDA graphs
  now follow other calls and record again), and compared with eager steps at the same micro-batch size (the
  trial's, else EAGER_STEPS measured first). With `auto` the fastest scope is kept when it is faster
  than eager; otherwise the run goes back to eager, and the compilation was the whole cost. `on`
  keeps the fastest scope (and reports the comparison).
- A compiled step that raises (a compiler or driver problem) puts the run on the next narrower scope,
  or back to eager; the loop redoes that step.
Each decision is one `compile:` line in the log, and `summary()` goes into train_summary.json.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from pathlib import Path

from ..model.compiled import (
    CACHE_FOLDER,
    TRIED,
    WARMUP_AND_RECORD,
    cached_graphs,
    compilations,
    describe,
    graphs_between,
    keep_compiled_code,
)

# auto: training time that must be left to try compiling. On an H100 (MMS size, micro-batch 32, bf16)
# compiling "segments" took 78 s and "graphs" 260 s more; a "graphs" step ran 3.09x the eager one,
# earned back ~8 min after compiling began. The margin covers slower compilers and a run's many
# shapes, each recording its CUDA graphs (bench_compile.py saw few)
COMPILE_MIN_MINUTES = 40.0
EAGER_STEPS = 3  # eager steps measured first when no trial measured the size (the first a warm-up)
COMPILE_STEPS = 2  # the first compiles, the second records CUDA graphs (one more warm-up elsewhere)
MEASURE_STEPS = 3  # compiled steps compared with the eager ones
# steps after those that compiled again, taken as compilation, not measured: with "graphs" each new
# path of padded lengths (data/shapes.py: one per frame edge, ~17 in a run of 1-10 s clips) is warmed
# up in one step and recorded in another (0.5-0.7 s and 5-8 s for the MMS-size model on an H200)
LATE_COMPILE_STEPS = 64
# after the step goes to another scope on a GPU, steps taken as compilation: CUDA graph trees record a
# graph per path of calls, and a part whose calls now follow eager parts (or compiled ones) is on a new
# path: one step may warm it up and one record it, as for a new path of shapes. On an H200 the two steps
# after the switch from "graphs" to "segments" took 1.3 s against 0.28 s after them
SWITCH_STEPS = WARMUP_AND_RECORD
FASTER = 0.97  # kept when a compiled step takes less than this share of an eager one (per sample)


class CompileChoice:
    """The compile decision of one run. `use(on)` switches the step (GanStep.use_compiled)."""

    def __init__(
        self,
        setting: str,
        device_type: str,
        processes: int,
        gradient_checkpointing: bool,
        use: Callable[..., None],
        log: Callable[[str], None],
        compilations: Callable[[], int] = compilations,
        scopes: tuple[str, ...] = TRIED,
        checkpoint_dir: Path | None = None,
        cache_counts: Callable[[], tuple[int, int]] = cached_graphs,
        gpu_problem: str | None = None,
    ) -> None:
        self.setting = setting
        self.device_type = device_type
        self.processes = processes
        self.gradient_checkpointing = gradient_checkpointing
        self.use = use  # use(True, scope=...) / use(False): GanStep.use_compiled
        # why Triton cannot make this GPU's kernels (triton_support.triton_problem), None if it can
        self.gpu_problem = gpu_problem
        self.scopes = scopes  # measured in this order; the first is compiled, the others are subsets
        self.scope: str | None = None  # the scope the step runs (being measured, or kept)
        self.log = log
        self.compilations = compilations  # graphs compiled (and CUDA graphs recorded) so far
        self.graphs_seen = 0
        # "undecided" -> "off" | "eager" (measuring) -> "compiling" -> "measuring" -> "on" | "off"
        self.phase = "undecided"
        self.reason = ""
        self.eager: list[float] = []  # seconds per sample of eager steps (the first may be a warm-up)
        self.eager_reference: float | None = None
        self.compile_steps: list[float] = []  # seconds of the compiling steps
        self.measured: dict[str, list[float]] = {}  # seconds per sample of compiled steps, by scope
        self.compile_seconds: float | None = None
        self.failures = 0
        self.switched = 0  # steps after a switch of scope still taken as compilation (SWITCH_STEPS)
        self.late_steps = 0  # steps after the compiling ones taken as compilation (LATE_COMPILE_STEPS)
        self.step_samples = 0  # clips of the last whole step (observe's `samples`)
        # where compiled code is kept for a resume (None: torch's default, in the temporary folder)
        self.cache_folder = None if checkpoint_dir is None else Path(checkpoint_dir) / CACHE_FOLDER
        self.cache: str | None = None  # the folder in use once compiling
        self.cache_counts = cache_counts  # (graphs read back from the cache, compiled afresh) so far
        self.cache_start: tuple[int, int] | None = None  # the counts when compiling began

    @property
    def begun(self) -> bool:
        """`begin` was called (the micro-batch size is fixed): each step's time goes to `observe` from
        here, which measures, compiles and judges; whether the step stays compiled is known only once
        the phase is "on" or "off"."""
        return self.phase != "undecided"

    @property
    def active(self) -> bool:
        """The step runs compiled now."""
        return self.phase in ("compiling", "measuring", "on")

    def why_not(self, training_seconds_left: float, max_steps: int = 0) -> str | None:
        """Why this run stays eager, or None when it should try compiling. `max_steps`: the --max_steps
        that ends the training time left before the budget does (0: the budget ends it)."""
        if self.setting == "off":
            return "--compile off"
        if self.processes > 1:
            return "not supported with several processes"
        if self.gradient_checkpointing:
            return "not combined with --gradient_checkpointing"
        if self.gpu_problem:  # `on` too: the first compiled step would fail with the compiler's error
            return f"--compile {self.setting}: {self.gpu_problem}"
        if self.setting == "on":
            return None
        if self.device_type != "cuda":
            return "auto: only on CUDA (CUDA graphs are what it gains; on a CPU compiling takes minutes)"
        if training_seconds_left < COMPILE_MIN_MINUTES * 60:
            until = f" before --max_steps {max_steps}" if max_steps else ""
            return (
                f"auto: {training_seconds_left / 60:.0f} min of training left{until}, too short to earn back "
                f"the compilation (it tries from {COMPILE_MIN_MINUTES:.0f} min)"
            )
        return None

    def begin(
        self, training_seconds_left: float, eager_seconds_per_sample: float | None, max_steps: int = 0
    ) -> None:
        """Start, once the micro-batch size is fixed: off at once when `why_not` says so, else compile
        (first measuring eager steps when the trial measured none at that size: `eager_seconds_per_sample`,
        the trial's figure); `max_steps` as in why_not. `observe` takes it from there."""
        reason = self.why_not(training_seconds_left, max_steps)
        if reason is not None:
            self._off(reason)
            return
        self.eager_reference = eager_seconds_per_sample
        if eager_seconds_per_sample is None:
            self.phase = "eager"  # measure the eager step first
        else:
            self._start_compiling()

    def observe(self, seconds: float, samples: int, clean: bool) -> bool:
        """One optimiser step ended. `samples`: the clips it put through the networks, every process's
        (loop.Trainer's `clips`, not the epoch's samples the budget counts); each "per sample" figure
        here is per such clip. `clean`: a whole step at the run's micro-batch size, run once. Returns
        whether its time measures the run's speed (False for the compiling steps)."""
        per_sample = seconds / samples if samples else None
        if clean:
            self.step_samples = samples  # a whole step's: what a later judgement's figures are per step of
        if self.phase == "eager":
            if clean and per_sample is not None:
                self.eager.append(per_sample)
            if len(self.eager) >= EAGER_STEPS:
                self.eager_reference = statistics.median(self.eager[1:])
                self._start_compiling()
            return True
        compiled_again = False
        if self.active:
            graphs = self.compilations()
            compiled_again, self.graphs_seen = graphs != self.graphs_seen, graphs
        if self.phase == "compiling":
            self.compile_steps.append(seconds)
            if len(self.compile_steps) >= COMPILE_STEPS:
                self.phase = "measuring"
            return False
        if self.switched and self.active:  # a new scope's CUDA graphs warming up or recording
            self.switched -= 1
            self.compile_steps.append(seconds)
            return False
        # a step that compiled again (a new micro-batch size, new lengths) or warmed up or recorded CUDA
        # graphs for a new path of shapes, measured or kept compiled
        if compiled_again and self.late_steps < LATE_COMPILE_STEPS:
            self.late_steps += 1
            self.compile_steps.append(seconds)
            return False
        if self.phase == "measuring":
            if clean and per_sample is not None:
                self.measured.setdefault(self.scope, []).append(per_sample)
            if len(self.measured.get(self.scope, [])) >= MEASURE_STEPS:
                narrower = self._narrower()
                if narrower is not None:  # its parts are compiled already: measure it next
                    self._switch(narrower)
                else:
                    self._judge(samples)
            return True
        return True

    def backed_off_after(self, err: BaseException) -> bool:
        """A step raised `err`: when it ran compiled, back off (a narrower scope, the scopes measured
        before it judged, or eager) and return True: redo the step. False: the step was eager, so the
        error is not the compiler's and the caller raises it."""
        if not self.active:
            return False
        self.failures += 1
        first_line = (str(err).strip().splitlines() or [type(err).__name__])[0][:300]
        what = f"the compiled step failed ({type(err).__name__}: {first_line})"
        narrower = self._narrower()
        self.measured.pop(self.scope, None)  # the failed scope's figures go: it cannot be chosen
        if narrower is not None:
            self._switch(narrower)
            self.log(f"compile: {what}; now compiling only {describe(self.scope)}, redoing the step")
            return True
        if self._best() is not None and self.step_samples:  # a wider scope measured well before it
            self.log(f"compile: {what}; judging the scopes measured before it, redoing the step")
            self._judge(self.step_samples)
            return True
        self.use(False)
        self.phase, self.reason = "off", what
        self.log(f"compile: {self.reason}; back to eager, redoing the step")
        return True

    def summary(self) -> dict:
        eager, compiled = self.eager_reference, self._compiled_per_sample()
        hits, misses = self._cache_use()
        return {
            "setting": self.setting,
            "compiled": self.phase == "on",
            "state": self.phase,
            "scope": self.scope if self.phase == "on" else None,
            "reason": self.reason,
            "compile_seconds": self.compile_seconds,
            "cache": self.cache,
            "cache_hits": hits,
            "cache_misses": misses,
            "eager_seconds_per_sample": eager,
            "compiled_seconds_per_sample": compiled,
            "speedup": (eager / compiled) if eager and compiled else None,
            "seconds_per_sample_by_scope": self._medians(),
        }

    # ---- transitions ----------------------------------------------------------------------------

    def _off(self, reason: str) -> None:
        self.phase, self.reason = "off", reason
        # a request this machine cannot honour is a warning, as for --bf16 on a GPU without it (not
        # when another reason, several processes, --gradient_checkpointing, keeps it off first)
        warning = (
            "warning: " if self.setting == "on" and self.gpu_problem and self.gpu_problem in reason else ""
        )
        self.log(f"{warning}compile: off ({reason})")

    def _start_compiling(self) -> None:
        self.scope = self.scopes[0]
        graphs = ""
        if self.device_type == "cuda":
            graphs = (
                " (as CUDA graphs, one per path of batch shapes)"
                if self.scope == "graphs"
                else " (the decoder and discriminator passes as CUDA graphs)"
            )
        self.log(
            f"compile: compiling {describe(self.scope)}{graphs} (--compile {self.setting}); "
            f"the next {COMPILE_STEPS} steps include the compilation"
        )
        if self.cache_folder is not None:
            self.cache, users = keep_compiled_code(self.cache_folder)
            self.log(
                f"compile: compiled code kept in {self.cache}"
                + (" (TORCHINDUCTOR_CACHE_DIR)" if users else "; a resumed run reuses it (safe to delete)")
            )
        self.graphs_seen = self.compilations()
        self.cache_start = self.cache_counts()
        self.use(True, scope=self.scope)
        self.phase = "compiling"

    def _switch(self, scope: str) -> None:
        """Run `scope` (its parts compiled already); on a GPU its next SWITCH_STEPS steps are compilation,
        unless the step is compiling anyway."""
        self.scope = scope
        self.use(True, scope=scope)
        self.switched = SWITCH_STEPS if self.device_type == "cuda" and self.phase != "compiling" else 0

    def _narrower(self) -> str | None:
        """The scope after the current one (made of parts compiled already), if any."""
        following = self.scopes[self.scopes.index(self.scope) + 1 :] if self.scope in self.scopes else ()
        return following[0] if following else None

    def _medians(self) -> dict[str, float]:
        """Seconds per sample of each measured scope's steps."""
        return {scope: statistics.median(times) for scope, times in self.measured.items() if times}

    def _best(self) -> str | None:
        """The measured scope with the fastest step."""
        medians = self._medians()
        return min(medians, key=medians.get) if medians else None

    def _compiled_per_sample(self) -> float | None:
        return self._medians().get(self.scope)

    def _cache_use(self) -> tuple[int, int]:
        """(graphs read back from the cache, graphs compiled afresh) since compiling began (0, 0 if never)."""
        if self.cache_start is None:
            return 0, 0
        return graphs_between(self.cache_start, self.cache_counts())

    def _cache_note(self) -> str:
        hits, misses = self._cache_use()
        return f"; {hits} of {hits + misses} graphs read back from the cache" if hits else ""

    def _judge(self, samples: int) -> None:
        best = self._best()
        if best is not None and best != self.scope:
            self._switch(best)  # compiled already: nothing compiles again (CUDA graphs may record)
        eager, compiled = self.eager_reference, self._compiled_per_sample()
        # what compiling cost beyond the eager steps it replaced
        self.compile_seconds = max(
            0.0, sum(self.compile_steps) - len(self.compile_steps) * samples * (eager or 0.0)
        )
        ratio = eager / compiled if eager and compiled else None
        measured = (
            f"a step {compiled * samples:.2f} s against {eager * samples:.2f} s eager"
            if eager and compiled
            else "no eager step to compare with"
        )
        others = "".join(
            f"; with {describe(scope)} compiled a step took {per_sample * samples:.2f} s"
            for scope, per_sample in self._medians().items()
            if scope != self.scope
        )
        if self.setting == "on" or (ratio is not None and compiled < FASTER * eager):
            self.phase = "on"
            self.reason = f"{ratio:.2f}x the eager step" if ratio else "--compile on"
            payback = ""
            if ratio is not None and compiled < eager:
                payback = (
                    f", earned back after ~{self.compile_seconds / ((eager - compiled) * samples):.0f} steps"
                )
            self.log(
                f"compile: on{' (--compile on)' if self.setting == 'on' else ''}, {describe(self.scope)}: "
                f"compiled in {self.compile_seconds:.0f} s; {measured}{f' ({ratio:.2f}x)' if ratio else ''}"
                f"{payback}{others}{self._cache_note()}"
            )
        else:
            self.use(False)
            self.phase = "off"
            self.reason = f"the compiled step was not faster ({ratio:.2f}x)" if ratio else "not measured"
            self.log(
                f"compile: back to eager: {measured}{others}; compiling cost {self.compile_seconds:.0f} s"
                f"{self._cache_note()}"
            )
