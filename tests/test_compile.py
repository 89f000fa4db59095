"""The compiled step (model/compiled.py) computes what the eager one does, and the loop's choice of it
(training/compile_choice.py): skipped when it cannot pay, measured, undone when slower or failing.

On this CPU the tests compile with the "aot_eager" backend: torch's real graph capture (Dynamo) and
its forward/backward split (AOTAutograd), without inductor's code generation, which takes minutes of
C++ compilation on 2 cores. tests/test_gpu.py runs the default backend with CUDA graphs on a GPU.
"""

from __future__ import annotations

import json
import math
import os
import re
import time

import pytest
import torch

from tests.helpers import COMPILE_ON_STEPS, tiny_config, train_tiny
from tests.test_vits_training import one_batch
from vits_trainer.model import compiled as compiled_module
from vits_trainer.training import compile_choice
from vits_trainer.training.compile_choice import CompileChoice
from vits_trainer.training.session import build_session
from vits_trainer.training.step import GanStep


def _session(tmp_path, tone_corpus, tiny_model_dir, **overrides):
    cfg = tiny_config(tmp_path, tone_corpus, tiny_model_dir, max_steps=1, **overrides)
    torch.manual_seed(0)
    return build_session(cfg, time.time())


def _run_steps(step: GanStep, batch: dict, steps: int) -> list[dict[str, float]]:
    out = []
    for i in range(steps):
        torch.manual_seed(100 + i)  # the same segments and noise in both runs
        result = step(batch)
        out.append({k: float(v) for k, v in result.metrics.items()})
    return out


def test_use_compiled_false_restores_the_eager_step(tmp_path, tiny_model_dir, tone_corpus):
    s = _session(tmp_path, tone_corpus, tiny_model_dir)
    step = GanStep(s.accelerator, s.generator, s.discriminator, s.g_optimizer, s.d_optimizer)
    step.use_compiled(True, backend="aot_eager")
    step.use_compiled(False)
    assert step.compiled_disc is None and not s.generator_raw.compiled


def test_scopes_switch_without_compiling_a_part_twice_and_an_unknown_one_is_refused(
    tmp_path, tiny_model_dir, tone_corpus
):
    """The trainer compiles the widest scope it measures, then narrower ones from the same parts."""
    s = _session(tmp_path, tone_corpus, tiny_model_dir)
    step = GanStep(s.accelerator, s.generator, s.discriminator, s.g_optimizer, s.d_optimizer)
    step.use_compiled(True, backend="aot_eager")
    assert compiled_module.SCOPE == "segments" and set(s.generator_raw.compiled) == {"decoder"}
    decoder, disc = s.generator_raw.compiled["decoder"], step.compiled_disc
    step.use_compiled(True, backend="aot_eager", scope="fused")
    fused = dict(s.generator_raw.compiled)
    assert set(fused) == {"decoder", *compiled_module.UTTERANCE_PARTS}
    step.use_compiled(True, backend="aot_eager", scope="segments")
    assert s.generator_raw.compiled == {"decoder": decoder} and step.compiled_disc is disc
    step.use_compiled(True, backend="aot_eager", scope="fused")
    assert s.generator_raw.compiled == fused and fused["decoder"] is decoder
    with pytest.raises(ValueError, match="unknown compile scope 'all'"):
        step.use_compiled(True, backend="aot_eager", scope="all")


def test_compile_mode_uses_cuda_graphs_only_on_a_gpu():
    assert compiled_module.compile_mode("cuda") == "reduce-overhead"
    assert compiled_module.compile_mode("cuda", graphs=False) == "default"
    assert compiled_module.compile_mode("cpu") == "default"


def test_the_compiled_step_gives_the_eager_losses_and_new_lengths_compile_nothing(
    tmp_path, tiny_model_dir, tone_corpus
):
    """The "fused" scope compiles every network the step runs ("segments" compiles a subset of them, the
    same way). Three full optimiser steps from the same weights on the same batch: every loss and both
    gradient norms agree with eager, so the compiled graphs (decoder, discriminator with its frozen
    generator pass, encoders, flow, duration predictor) also produce the same gradients and updates.
    The utterance parts see each batch's own text and frame lengths: captured once (aot_eager) for
    every length, later shapes compile nothing (on a GPU a compile costs seconds to minutes, so a run
    must not meet one per shape). An evaluation forward (full length, no gradients) runs eager and
    compiles nothing; nor does speaking a sentence under the duration bound's forward hook."""
    from torch._dynamo.backends.registry import lookup_backend

    from vits_trainer.data.loader import ClipDataset, collate_batch

    graphs = []

    def counting_backend(gm, example_inputs):
        graphs.append(gm)
        return lookup_backend("aot_eager")(gm, example_inputs)

    results = {}
    for mode in ("eager", "compiled"):
        s = _session(tmp_path / mode, tone_corpus, tiny_model_dir)
        step = GanStep(s.accelerator, s.generator, s.discriminator, s.g_optimizer, s.d_optimizer)
        if mode == "compiled":
            torch._dynamo.reset()
            step.use_compiled(True, backend=counting_backend, scope="fused")
            expected = {*compiled_module.SEGMENT_PARTS, *compiled_module.UTTERANCE_PARTS}
            assert set(s.generator_raw.compiled) == expected
        results[mode] = _run_steps(step, one_batch(s), 3)
    assert not any("_orig_mod" in k for k in s.model.state_dict())  # compiled callables are not saved
    assert not any("_orig_mod" in k for k in s.discriminator_raw.state_dict())
    for eager, comp in zip(results["eager"], results["compiled"], strict=True):
        assert eager.keys() == comp.keys()
        for key in eager:
            assert comp[key] == pytest.approx(eager[key], rel=1e-4, abs=1e-6), key

    compiled_once = len(graphs)
    assert compiled_once > 0
    dataset = ClipDataset(s.data.train)
    by_length = sorted(range(len(dataset)), key=lambda i: len(dataset[i]["audio"]))
    batches = []  # 4 clips each, as one_batch, from the shortest to the longest: each its own lengths
    for k in (0, 3, 1, 2):
        batch = collate_batch([dataset[i] for i in by_length[4 * k : 4 * k + 4]])
        batch.pop("indices")
        batch.pop("text_lengths")
        batches.append(batch)
    shapes = [(b["input_ids"].shape[-1], b["audio"].shape[-1]) for b in batches]
    assert len(set(shapes)) == 4, shapes
    counts = []
    for i, batch in enumerate(batches):
        torch.manual_seed(i)
        assert not step(batch).skipped
        counts.append(len(graphs))
    assert counts == [compiled_once] * 4, (counts, shapes)

    s.generator.eval()
    with torch.no_grad():
        s.generator(
            batches[0]["input_ids"],
            batches[0]["attention_mask"],
            batches[0]["audio"],
            batches[0]["audio_lengths"],
            full_length=True,
        )
    assert len(graphs) == compiled_once
    # speaking a sentence (samples, free-running scores) bounds the durations with a forward hook on
    # the duration predictor, removed after it: the next compiled step compiles nothing again
    from vits_trainer.model.synthesis import bounded_durations

    with torch.no_grad(), bounded_durations(s.model):
        s.model(input_ids=batches[0]["input_ids"][:1], attention_mask=batches[0]["attention_mask"][:1])
    s.generator.train()
    torch.manual_seed(0)
    assert not step(batches[0]).skipped
    assert len(graphs) == compiled_once


class _FixesItsLength(torch.nn.Module):
    """A module whose code needs its input's length as a Python int: torch compiles it per length."""

    def forward(self, x):
        return x * torch.tensor([1.0] * x.shape[-1])


def test_a_part_that_compiles_again_for_new_lengths_goes_back_to_eager():
    lines = []
    part = compiled_module.LengthChecked("flow", _FixesItsLength(), "cpu", "aot_eager", False, lines.append)
    for length in (5, 6, 5, 7, 8):  # 5 twice: a length seen before compiles nothing
        torch.testing.assert_close(part(torch.ones(2, length)), torch.ones(2, length))
    assert part.recompiles == 3 and part.eager_reason == "new lengths compiled it again 3 times"
    assert lines == ["compile: the flow runs eager: new lengths compiled it again 3 times"]
    graphs = part.graphs
    part(torch.ones(2, 9))  # eager now: nothing more is compiled
    assert part.graphs == graphs and part.recompiles == 3


class _FloatAttributes(torch.nn.Module):
    """Float attributes, as every VITS part has (dropout rates, the attention's scaling)."""

    def __init__(self):
        super().__init__()
        self.dropout = torch.nn.Dropout(0.0)
        self.scale = 0.5

    def forward(self, x):
        return self.dropout(x * self.scale)


def test_a_part_with_float_attributes_is_traced_once():
    """Under symbolic shapes Dynamo makes a module's float attributes symbolic, meets an operator that
    needs a number (dropout's rate) and traces the whole part again with them fixed: without
    LengthChecked fixing them from the start, the backend receives the graph twice (on a GPU, inductor
    compiles twice)."""
    torch._dynamo.reset()
    part = compiled_module.LengthChecked("flow", _FloatAttributes(), "cpu", "aot_eager", False, print)
    for length in (5, 6):
        torch.testing.assert_close(part(torch.ones(2, length)), torch.full((2, length), 0.5))
    assert part.graphs == 1 and part.recompiles == 0


def test_a_new_path_of_shapes_under_cuda_graphs_counts_as_compiling_until_it_is_recorded():
    """With "graphs", CUDA graph trees run each new path of shapes (the graphs a micro-step runs, in
    order) once to warm up and record it the next time, both slower than eager: compilations() counts
    those calls and compile_choice takes their steps for compilation. A part's shape seen before, after
    another shape of the part before it, is a new path. Only inductor with CUDA graphs on a GPU records;
    without a GPU here aot_eager parts are taken as ones that do."""
    made = {
        (device, backend, graphs): compiled_module.LengthChecked(
            "flow", _FloatAttributes(), device, backend, graphs, print
        ).records_graphs
        for device in ("cuda", "cpu")
        for backend in ("inductor", "aot_eager")
        for graphs in (True, False)
    }
    assert [key for key, records in made.items() if records] == [("cuda", "inductor", True)]
    torch._dynamo.reset()
    first, second = (
        compiled_module.LengthChecked(name, _FloatAttributes(), "cpu", "aot_eager", True, print)
        for name in ("text_encoder", "flow")
    )
    first.records_graphs = second.records_graphs = True
    counts = [compiled_module.compilations()]
    steps = [(5, 7)] * 3 + [(6, 7)] * 3 + [(5, 8)] * 3 + [(5, 7)]
    for lengths in steps:
        compiled_module.mark_step_begin("cpu")
        for part, length in zip((first, second), lengths, strict=True):
            part(torch.ones(2, length))
        counts.append(compiled_module.compilations())
    assert [b - a for a, b in zip(counts[:-1], counts[1:], strict=True)] == [
        4,  # both parts compiled (symbolic lengths) and warmed up
        2,  # recorded
        0,  # replayed
        2,  # (6, 7): the flow's 7 after a new 6 is a new path too
        2,
        0,
        1,  # (5, 8): only the flow's part of the path is new
        1,
        0,
        0,  # (5, 7) again: replayed
    ]


def test_inductor_compiles_a_1d_convolution_and_its_backward_once_for_every_length(tmp_path, monkeypatch):
    """Real code generation (inductor, on the CPU): torch 2.13 fixes the length of a 1-D convolution's
    backward to the first batch's unless model/compiled.py keeps it symbolic."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))  # no cached code from other runs
    torch._dynamo.reset()
    torch.manual_seed(0)
    conv = torch.nn.Conv1d(2, 2, 3, padding=1)
    compiled_module.keep_conv1d_backward_dynamic()
    part = compiled_module.LengthChecked("posterior_encoder", conv, "cpu", "inductor", False, print)
    for length in (16, 24, 32):
        x = torch.randn(1, 2, length, requires_grad=True)
        part(x).square().sum().backward()
        grad = x.grad
        x.grad = None
        conv(x).square().sum().backward()
        torch.testing.assert_close(grad, x.grad)
    assert part.graphs == 1 and part.recompiles == 0 and part.eager_reason is None


def test_inductor_compiles_relative_position_attention_once_for_every_length(tmp_path, monkeypatch):
    """Real code generation (inductor, on the CPU) of the text encoder's attention, whose relative
    position scores inductor's forward lays out differently from eager: torch 2.13 compiles the
    backward for the first batch's strides, and the next length failed its stride assertion, unless
    model/compiled.py hands the backward the forward's stride expressions."""
    from transformers.models.vits.modeling_vits import VitsAttention

    from vits_trainer.model.tiny import tiny_config as vits_config

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    torch._dynamo.reset()
    torch.manual_seed(0)
    config = vits_config(10, hidden_size=8, num_attention_heads=2, attention_dropout=0.0)
    attention = VitsAttention(config).train()
    assert attention.window_size < 6  # every length below takes the same path (no padding branch)
    compiled_module.keep_saved_strides_symbolic()
    part = compiled_module.LengthChecked("text_encoder", attention, "cpu", "inductor", False, print)
    graphs = []
    for length in (6, 8, 10):
        x = torch.randn(2, length, 8, requires_grad=True)
        part(x)[0].square().sum().backward()  # without the fix: AssertionError at length 10
        graphs.append(part.graphs)
        grad = x.grad
        x.grad = None
        attention(x)[0].square().sum().backward()
        torch.testing.assert_close(grad, x.grad, rtol=1e-4, atol=1e-5)
    assert graphs[0] == graphs[-1] and part.recompiles == 0 and part.eager_reason is None


# ---- the loop's choice ---------------------------------------------------------------------------


def test_compile_on_trains_compiled_and_reports_the_comparison(
    tmp_path, tiny_model_dir, tone_corpus, monkeypatch, capsys
):
    monkeypatch.setattr(compiled_module, "BACKEND", "aot_eager")  # see the module docstring
    # each new shape counted as a recording of CUDA graphs, as on a GPU (inductor's "reduce-overhead"):
    # tests/test_gpu.py's runner test has as many steps as this one to reach the decision with them
    made = compiled_module.LengthChecked.__init__

    def records_graphs_as_on_a_gpu(self, *args, **kwargs):
        made(self, *args, **kwargs)
        self.records_graphs = True

    monkeypatch.setattr(compiled_module.LengthChecked, "__init__", records_graphs_as_on_a_gpu)
    # 3 eager, 2 compiling and 2 x 3 measured steps, with room for steps that compile again (a new
    # length or micro-batch size: those are compilation, not measured); the micro-batch is forced, as
    # the trial's choice (by speed, so by the machine's load) would change how many there are
    session, summary = train_tiny(
        tmp_path, tone_corpus, tiny_model_dir, max_steps=COMPILE_ON_STEPS, compile="on", micro_batch_size="8"
    )
    out = capsys.readouterr().out
    report = summary["compile"]
    assert report["setting"] == "on" and report["compiled"] and report["state"] == "on", report
    assert report["eager_seconds_per_sample"] > 0 and report["compiled_seconds_per_sample"] > 0
    assert report["compile_seconds"] is not None
    assert "compile: compiling the text encoder, posterior encoder, flow, duration predictor, decoder" in out
    assert "compile: on (--compile on), " in out and "compiled in" in out
    assert set(report["seconds_per_sample_by_scope"]) == {"graphs", "segments"}  # both measured
    assert summary["steps"] == COMPILE_ON_STEPS and summary["skipped_steps"] == 0
    kept = {"graphs": {"decoder", *compiled_module.UTTERANCE_PARTS}, "segments": {"decoder"}}
    assert set(session.generator_raw.compiled) == kept[report["scope"]]
    # the lines whose steps compiled say for how long: their samples/s is mostly the compiler's time
    lines = [r for r in map(json.loads, (tmp_path / "checkpoints" / "metrics.jsonl").open()) if "lr" in r]
    compiling = [r for r in lines if "compile_seconds" in r]
    assert compiling and all(0 < r["compile_seconds"] for r in compiling), lines
    assert len(compiling) < len(lines)  # the measured steps' lines have none
    assert re.search(r"^step \d+ \| .* \| samples/s [\d.]+ \| compiling \d+:\d\d \| wait ", out, re.M), out


def test_a_failing_compiled_step_falls_back_to_eager_and_the_run_goes_on(
    tmp_path, tiny_model_dir, tone_corpus, monkeypatch, capsys
):
    """A compiler or driver error inside a compiled step (simulated: the compiled discriminator raises)
    puts the run on a narrower scope, then back to eager; the step is redone and nothing is skipped."""

    class Broken(torch.nn.Module):
        def __init__(self, module):
            super().__init__()
            self.module = module

        def forward(self, *args):
            raise RuntimeError("simulated compiler failure\nsecond line")

    monkeypatch.setattr("vits_trainer.training.step.compiled_parts", lambda *a, **k: {})  # eager
    monkeypatch.setattr("vits_trainer.training.step.compiled", lambda module, *a, **k: Broken(module))
    session, summary = train_tiny(tmp_path, tone_corpus, tiny_model_dir, max_steps=6, compile="on")
    out = capsys.readouterr().out
    assert summary["steps"] == 6 and summary["skipped_steps"] == 0
    assert summary["compile"]["state"] == "off" and not summary["compile"]["compiled"]
    failed = "compile: the compiled step failed (RuntimeError: simulated compiler failure); "
    assert failed + "now compiling only the decoder and discriminator passes, redoing the step" in out
    assert failed + "back to eager, redoing the step" in out
    assert not session.generator_raw.compiled


def _eager_parts_for_compiled_ones(monkeypatch):
    """Each scope's parts handed back uncompiled, so the scope logic runs without compiling; the real
    GanStep.micro_step, for a test's stand-in to call."""

    def uncompiled(model, device_type, backend=None, scope="segments", log=print, made=None):
        names = compiled_module.SEGMENT_PARTS
        if scope != "segments":
            names = (*names, *compiled_module.UTTERANCE_PARTS)
        return {name: getattr(model, name) for name in names}

    monkeypatch.setattr("vits_trainer.training.step.compiled_parts", uncompiled)
    monkeypatch.setattr("vits_trainer.training.step.compiled", lambda module, *a, **k: module)
    return GanStep.micro_step


@pytest.mark.parametrize("first", ["compile", "memory"])
def test_compile_failures_and_running_out_of_memory_are_redone_in_either_order(
    tmp_path, tiny_model_dir, tone_corpus, monkeypatch, capsys, first
):
    """Simulated (no GPU here). compile: the widest scope fails to compile, and the step redone with the
    narrower one runs out of memory at 8 clips. memory: the widest scope runs out of memory at 8 clips,
    and the step redone in smaller micro-batches fails to compile. Either way the run goes on with the
    narrower scope at the smaller micro-batch, instead of ending on the second failure."""
    real = _eager_parts_for_compiled_ones(monkeypatch)

    def failing(self, batch, first_micro, last, scale):
        scope = self.accelerator.unwrap_model(self.generator).compiled
        too_big = batch["input_ids"].size(0) > 4
        if "text_encoder" in scope and (first == "compile" or not too_big):
            raise RuntimeError("simulated compiler failure")
        if scope and too_big:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(self, batch, first_micro, last, scale)

    monkeypatch.setattr(GanStep, "micro_step", failing)
    session, summary = train_tiny(
        tmp_path, tone_corpus, tiny_model_dir, max_steps=10, compile="on", micro_batch_size="8"
    )
    out = capsys.readouterr().out
    assert "now compiling only the decoder and discriminator passes, redoing the step" in out
    assert "out of memory at step" in out
    assert summary["steps"] == 10 and summary["skipped_steps"] == 0
    assert summary["compile"]["state"] == "on" and summary["compile"]["scope"] == "segments"
    assert set(session.generator_raw.compiled) == {"decoder"}


def _choice(
    setting="auto", device="cuda", processes=1, checkpointing=False, compilations=lambda: 0, scopes=None
):
    calls, lines = [], []

    def use(on, scope=None):  # GanStep.use_compiled: the scope switched to, False for eager
        calls.append(scope if on else False)

    scopes = scopes or compiled_module.TRIED
    choice = CompileChoice(setting, device, processes, checkpointing, use, lines.append, compilations, scopes)
    return choice, calls, lines


HOUR = 3600.0


@pytest.mark.parametrize(
    "setting, device, processes, checkpointing, left, reason",
    [
        ("off", "cuda", 1, False, HOUR, "--compile off"),
        ("auto", "cpu", 1, False, HOUR, "only on CUDA"),
        ("auto", "cuda", 2, False, HOUR, "several processes"),
        ("on", "cuda", 2, False, HOUR, "several processes"),
        ("auto", "cuda", 1, True, HOUR, "--gradient_checkpointing"),
        ("auto", "cuda", 1, False, 10 * 60, "10 min of training left, too short"),
    ],
)
def test_compile_stays_off_where_it_cannot_pay_or_run(
    setting, device, processes, checkpointing, left, reason
):
    choice, calls, lines = _choice(setting, device, processes, checkpointing)
    choice.begin(left, 0.01)
    assert choice.phase == "off" and not choice.active and calls == []
    assert reason in choice.reason and lines == [f"compile: off ({choice.reason})"]
    assert choice.observe(1.0, 8, True) is True  # every later step measures the run


P100 = "the Tesla P100-PCIE-16GB (compute capability 6.0) is older than Triton supports"


@pytest.mark.parametrize("setting, line", [("auto", "compile: off"), ("on", "warning: compile: off")])
def test_neither_auto_nor_on_compiles_for_a_gpu_the_compiler_cannot_make_kernels_for(setting, line):
    """On Kaggle's P100 inductor raises at the first compiled step (its GPU compiler, Triton, needs
    compute capability 7.0): the run says so before it, and stays eager; `on` is a request this GPU
    cannot honour, so its line is a warning."""
    calls, lines = [], []
    choice = CompileChoice(
        setting, "cuda", 1, False, lambda on, scope=None: calls.append(on), lines.append, gpu_problem=P100
    )
    choice.begin(HOUR, 0.01)
    assert choice.phase == "off" and calls == []
    assert choice.reason == f"--compile {setting}: {P100}"
    assert lines == [f"{line} ({choice.reason})"]
    assert choice.summary()["reason"] == choice.reason


@pytest.mark.parametrize("processes, checkpointing", [(2, False), (1, True)])
def test_on_stays_off_for_another_reason_on_an_old_gpu_without_a_warning(processes, checkpointing):
    """`--compile on` with several processes or --gradient_checkpointing is off for that reason, a plain
    `compile: off` line as on any GPU: the warning is for the GPU that cannot honour the request, and
    this line does not name it."""
    lines = []
    choice = CompileChoice(
        "on", "cuda", processes, checkpointing, lambda on, scope=None: None, lines.append, gpu_problem=P100
    )
    choice.begin(HOUR, 0.01)
    assert choice.phase == "off" and P100 not in choice.reason
    assert lines == [f"compile: off ({choice.reason})"]


def test_the_reason_names_max_steps_when_it_ends_the_time_left():
    """The budget hands over figures (Budget.training_left); the compile line words them."""
    choice, _, _ = _choice()
    assert choice.why_not(10 * 60, 6).startswith("auto: 10 min of training left before --max_steps 6, too")
    assert choice.why_not(10 * 60).startswith("auto: 10 min of training left, too short")


def test_auto_counts_the_training_time_max_steps_leaves(
    tmp_path, tiny_model_dir, tone_corpus, monkeypatch, capsys
):
    """A run that --max_steps ends in seconds is too short to earn back a compilation, whatever its
    budget (on an H100 `auto` spent 309 s compiling; a 40-step run of the tiny model stalled in it).
    The device is taken for CUDA's so that `auto` gets to the time test (nothing compiles either way)."""
    why_not = CompileChoice.why_not

    def as_on_cuda(choice, *args, **kwargs):
        choice.device_type = "cuda"
        return why_not(choice, *args, **kwargs)

    monkeypatch.setattr(CompileChoice, "why_not", as_on_cuda)
    _, summary = train_tiny(tmp_path, tone_corpus, tiny_model_dir, max_steps=6, compile="auto")
    assert summary["steps"] == 6 and not summary["compile"]["compiled"]
    reason = summary["compile"]["reason"]
    assert re.match(r"auto: \d+ min of training left before --max_steps 6, too short", reason), reason
    assert f"compile: off ({reason})" in capsys.readouterr().out


def _steps(choice, seconds_per_step: list[float], samples: int = 8) -> list[bool]:
    return [choice.observe(sec, samples, True) for sec in seconds_per_step]


def test_auto_keeps_the_fastest_scope_and_the_budget_skips_the_compiling_steps():
    """The widest scope is compiled and measured, then the narrower one from the same compiled parts;
    the faster is kept."""
    choice, calls, lines = _choice("auto")
    choice.begin(2 * HOUR, None)  # no trial figure: eager steps are measured first
    assert choice.phase == "eager" and calls == []
    assert _steps(choice, [9.0, 1.0, 1.0]) == [True, True, True]  # a slow warm-up, then 1 s steps
    assert calls == ["graphs"] and choice.phase == "compiling" and choice.eager_reference == 1.0 / 8
    assert "compile: compiling the text encoder, posterior encoder, flow, duration predictor" in lines[-1]
    assert _steps(choice, [60.0, 5.0]) == [False, False]  # compilation: not a step's time
    assert _steps(choice, [0.5, 0.5, 0.5]) == [True, True, True]
    assert calls == ["graphs", "segments"] and choice.phase == "measuring"
    # the first SWITCH_STEPS steps of the new scope record its CUDA graphs anew: compilation too
    assert _steps(choice, [1.5, 1.5, 0.8, 0.8, 0.8]) == [False, False, True, True, True]
    assert choice.phase == "on" and calls == ["graphs", "segments", "graphs"]  # back to the faster
    summary = choice.summary()
    assert summary["compiled"] and summary["scope"] == "graphs" and summary["speedup"] == pytest.approx(2.0)
    assert summary["seconds_per_sample_by_scope"] == pytest.approx({"graphs": 0.5 / 8, "segments": 0.8 / 8})
    assert summary["compile_seconds"] == pytest.approx(64.0)  # 68 s, less the 4 eager steps they replaced
    assert lines[-1].startswith(
        "compile: on, the text encoder, posterior encoder, flow, duration predictor, decoder and "
        "discriminator passes: compiled in 64 s; a step 0.50 s against 1.00 s eager (2.00x), "
        "earned back after ~128 steps; with the decoder and discriminator passes compiled a step took 0.80 s"
    )
    # going back to "graphs" is a switch too: the budget does not take those steps as the run's speed
    assert _steps(choice, [1.5, 1.5, 0.5]) == [False, False, True]


def test_auto_keeps_the_narrower_scope_when_it_is_faster():
    choice, calls, lines = _choice("auto")
    choice.begin(2 * HOUR, 1.0 / 8)  # the trial's figure for this size
    _steps(choice, [60.0, 5.0, 0.9, 0.9, 0.9, 2.0, 2.0, 0.6, 0.6, 0.6])
    assert calls == ["graphs", "segments"] and choice.summary()["scope"] == "segments"
    assert "compile: on, the decoder and discriminator passes: compiled in" in lines[-1]


def test_steps_that_compile_again_count_as_compilation_not_as_measured_steps():
    """A part meeting new lengths compiles again after the compiling steps (until LengthChecked sends
    it back to eager): those steps are compilation time, and the measurement waits for clean ones."""
    graphs = [10]
    choice, calls, lines = _choice("auto", compilations=lambda: graphs[0], scopes=("segments",))
    choice.begin(2 * HOUR, 1.0 / 8)
    graphs[0] = 20  # the compilation
    assert _steps(choice, [60.0, 5.0]) == [False, False]
    graphs[0] = 21  # a recompilation in the first step after them
    assert _steps(choice, [30.0]) == [False]
    assert _steps(choice, [0.5, 0.5]) == [True, True] and choice.phase == "measuring"
    graphs[0] = 22
    assert _steps(choice, [20.0, 0.5]) == [False, True]
    assert choice.phase == "on" and choice.summary()["speedup"] == pytest.approx(2.0)
    assert choice.summary()["compile_seconds"] == pytest.approx(115.0 - 4 * 1.0)


def test_auto_goes_back_to_eager_when_no_compiled_scope_is_faster():
    choice, calls, lines = _choice("auto")
    choice.begin(2 * HOUR, 1.0 / 8)  # the trial's figure for this size
    assert calls == ["graphs"] and choice.phase == "compiling"
    _steps(choice, [30.0, 2.0, 1.1, 1.1, 1.1, 3.0, 3.0, 1.0, 0.99, 1.2])
    assert calls == ["graphs", "segments", False] and choice.phase == "off"
    assert not choice.summary()["compiled"] and choice.summary()["scope"] is None
    assert "compile: back to eager: a step 1.00 s against 1.00 s eager" in lines[-1]


def test_compile_on_keeps_the_compiled_step_even_when_slower():
    choice, calls, lines = _choice("on", device="cpu")
    choice.begin(60.0, 1.0 / 8)  # a short run on a CPU: the user asked for it
    _steps(choice, [30.0, 2.0, 1.2, 1.2, 1.2, 1.3, 1.3, 1.3])
    assert (
        calls == ["graphs", "segments", "graphs"] and choice.phase == "on" and "(--compile on)" in lines[-1]
    )


def test_a_failing_scope_is_dropped_for_the_narrower_one():
    choice, calls, lines = _choice("auto")
    choice.begin(2 * HOUR, 1.0 / 8)
    _steps(choice, [30.0])
    assert choice.backed_off_after(RuntimeError("inductor: something\ndetails")) is True
    assert calls == ["graphs", "segments"] and choice.active
    assert lines[-1] == (
        "compile: the compiled step failed (RuntimeError: inductor: something); now compiling only "
        "the decoder and discriminator passes, redoing the step"
    )
    _steps(choice, [2.0, 0.5, 0.5, 0.5])
    assert choice.phase == "on" and choice.summary()["scope"] == "segments"
    assert set(choice.summary()["seconds_per_sample_by_scope"]) == {"segments"}
    assert (
        choice.backed_off_after(RuntimeError("again")) is True
        and choice.phase == "off"
        and calls[-1] is False
    )


def test_a_narrow_scope_failing_after_a_wide_one_measured_well_keeps_the_wide_one():
    """The "graphs" scope measured at 3.3x eager, then the first "segments" step failed: the run went back to
    eager, throwing the measured 3.3x away."""
    choice, calls, lines = _choice("auto")
    choice.begin(2 * HOUR, 1.0 / 8)
    _steps(choice, [30.0, 2.0, 0.3, 0.3, 0.3])  # compiled, then measured
    assert calls == ["graphs", "segments"]
    assert choice.backed_off_after(RuntimeError("segments broke")) is True
    assert calls[-1] == "graphs" and choice.phase == "on" and choice.summary()["scope"] == "graphs"
    assert "judging the scopes measured before it" in lines[-2] and "compile: on, " in lines[-1]
    assert choice.summary()["speedup"] == pytest.approx(1.0 / 0.3)


def test_a_switch_of_scope_records_cuda_graphs_only_on_a_gpu():
    """Going from "graphs" to "segments" puts the decoder's and discriminator's CUDA graphs on a new path
    (the parts before them now eager): on the H200 the two steps after the switch took 1.3 s, 0.28 s
    after them; measured, they would make the narrower scope look slower than it is. A CPU has no CUDA
    graphs, and a switch while compiling is covered by the compiling steps."""
    for device, expected in (("cuda", [False, False, True, True, True]), ("cpu", [True, True, True])):
        choice, calls, _ = _choice("on", device=device)  # auto stays eager on a CPU
        choice.begin(2 * HOUR, 1.0 / 8)
        _steps(choice, [30.0, 2.0, 0.3, 0.3, 0.3])
        assert calls == ["graphs", "segments"]
        assert _steps(choice, [1.3, 1.3, 0.28, 0.28, 0.28][-len(expected) :]) == expected, device
        assert choice.phase == "on" and choice.summary()["seconds_per_sample_by_scope"]["segments"] == (
            pytest.approx(0.28 / 8)
        )
    choice, calls, _ = _choice("auto")
    choice.begin(2 * HOUR, 1.0 / 8)
    _steps(choice, [30.0])
    assert choice.backed_off_after(RuntimeError("graphs broke")) and choice.switched == 0


def test_short_steps_are_not_compared():
    """An epoch's short last step (a new shape: it compiles again) is not a measurement."""
    choice, calls, _ = _choice("auto")
    choice.begin(2 * HOUR, 1.0 / 8)
    _steps(choice, [30.0, 2.0])
    assert choice.observe(20.0, 3, clean=False) is True and choice.measured == {}


def test_compiled_code_is_kept_in_the_checkpoint_folder_unless_the_user_chose_one(tmp_path, monkeypatch):
    """A resumed run on a new Kaggle or Colab machine finds torch.compile's cache in its checkpoint
    folder (the temporary folder, inductor's default, starts empty there)."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    variable = compiled_module.CACHE_VARIABLE
    for before in (None, default_cache_dir()):  # unset, or inductor's default written on its first use
        if before is None:
            monkeypatch.delenv(variable, raising=False)
        else:
            monkeypatch.setenv(variable, before)
        for run in ("a", "b"):  # a second run in the same process gets its own folder
            lines = []
            choice = CompileChoice(
                "auto", "cuda", 1, False, lambda *a, **k: None, lines.append, checkpoint_dir=tmp_path / run
            )
            choice.begin(2 * HOUR, 1.0 / 8)
            kept = str((tmp_path / run / compiled_module.CACHE_FOLDER).resolve())
            assert os.environ[variable] == kept and choice.summary()["cache"] == kept
            assert f"compile: compiled code kept in {kept}; a resumed run reuses it" in lines[-1]
    monkeypatch.setenv(variable, str(tmp_path / "mine"))  # the user's choice stands
    lines = []
    choice = CompileChoice(
        "auto", "cuda", 1, False, lambda *a, **k: None, lines.append, checkpoint_dir=tmp_path
    )
    choice.begin(2 * HOUR, 1.0 / 8)
    assert os.environ[variable] == str(tmp_path / "mine") and choice.summary()["cache"] == str(
        tmp_path / "mine"
    )
    assert lines[-1] == f"compile: compiled code kept in {tmp_path / 'mine'} (TORCHINDUCTOR_CACHE_DIR)"


def test_inductor_reads_compiled_code_back_from_the_kept_folder(tmp_path, monkeypatch):
    """Real code generation (inductor, on the CPU): what one compilation wrote to the kept folder, a
    later one (Dynamo's caches reset, as in a new session) reads back, and cached_graphs counts it."""
    monkeypatch.delenv(compiled_module.CACHE_VARIABLE, raising=False)
    compiled_module.keep_compiled_code(tmp_path / "kept")
    uses = []
    for _ in range(2):
        torch._dynamo.reset()
        before = compiled_module.cached_graphs()
        fn = torch.compile(lambda x: (x.sin() * 3).sum(), backend="inductor", dynamic=False)
        assert float(fn(torch.ones(4))) == pytest.approx(12 * math.sin(1.0), rel=1e-5)
        uses.append(tuple(a - b for a, b in zip(compiled_module.cached_graphs(), before, strict=True)))
    assert uses == [(0, 1), (1, 0)]  # (read back, compiled afresh)
    assert any((tmp_path / "kept").rglob("*.py"))  # the generated code is in the folder


def test_the_log_says_how_many_graphs_came_from_the_cache():
    """A resumed run's compile line says how much of the compilation its kept folder saved."""
    counts = [(5, 2)]  # (read back, compiled afresh) in this process before the run compiles
    lines = []
    choice = CompileChoice(
        "auto", "cuda", 1, False, lambda *a, **k: None, lines.append, cache_counts=lambda: counts[0]
    )
    # nothing compiled yet: the process's earlier counts are not this run's
    assert choice.summary()["cache_hits"] == 0
    choice.begin(2 * HOUR, 1.0 / 8)
    counts[0] = (45, 3)
    _steps(choice, [20.0, 5.0, 0.5, 0.5, 0.5, 0.8, 0.8, 0.8, 0.8, 0.8])  # 2 steps after the switch
    assert choice.phase == "on" and lines[-1].endswith("; 40 of 41 graphs read back from the cache")
    assert choice.summary()["cache_hits"] == 40 and choice.summary()["cache_misses"] == 1
    lines.clear()
    choice = CompileChoice(
        "auto", "cuda", 1, False, lambda *a, **k: None, lines.append, cache_counts=lambda: (0, 9)
    )
    choice.begin(2 * HOUR, 1.0 / 8)
    _steps(
        choice, [20.0, 5.0, 1.5, 1.5, 1.5, 1.0, 1.0, 1.5, 1.5, 1.5]
    )  # slower: back to eager, nothing cached
    assert choice.phase == "off" and lines[-1].endswith("compiling cost 23 s")


def test_a_step_that_compiles_again_after_the_decision_is_not_taken_as_the_runs_speed():
    """Kept compiled, a step on a new micro-batch size (an epoch's short last step, an out-of-memory
    retry) compiles again: seconds to minutes on a GPU that the budget must not plan every later step
    by. It did so only before the decision."""
    graphs = [0]
    choice, _, _ = _choice("on", compilations=lambda: graphs[0])
    choice.begin(2 * HOUR, 1.0 / 8)
    graphs[0] = 10
    steps = [60.0, 5.0, 0.5, 0.5, 0.5, 1.0, 1.0, 0.5, 0.5, 0.5, 1.0, 1.0]  # SWITCH_STEPS after each switch
    assert (
        _steps(choice, steps)
        == [False, False, True, True, True, False, False, True, True, True] + [False] * 2
    )
    assert choice.phase == "on"
    graphs[0] = 11  # the next step compiled a graph for a new shape
    assert _steps(choice, [40.0, 0.5]) == [False, True]
    for _ in range(compile_choice.LATE_COMPILE_STEPS):  # at most so many: then every step counts again
        graphs[0] += 1
        choice.observe(40.0, 8, True)
    graphs[0] += 1
    assert choice.observe(40.0, 8, True) is True


def test_the_steps_after_a_switch_of_scope_leave_the_late_compilations_their_number():
    """The SWITCH_STEPS steps after each switch of scope on a GPU are compilation, but not of the
    LATE_COMPILE_STEPS a run's new shapes may take: counted among them, the last recordings of a run
    that switched twice would be measured as its speed (5-8 s a step against 0.3 s)."""
    graphs = [0]
    choice, calls, _ = _choice("on", compilations=lambda: graphs[0])
    choice.begin(2 * HOUR, 1.0 / 8)
    _steps(choice, [60.0, 5.0, 0.5, 0.5, 0.5, 1.5, 1.5, 0.8, 0.8, 0.8, 1.5, 1.5])  # two switches
    assert choice.phase == "on" and calls == ["graphs", "segments", "graphs"]
    late = []
    for _ in range(compile_choice.LATE_COMPILE_STEPS):
        graphs[0] += 1  # each step recorded CUDA graphs for a new path of shapes
        late.append(choice.observe(6.0, 8, True))
    assert late == [False] * compile_choice.LATE_COMPILE_STEPS
    graphs[0] += 1
    assert choice.observe(6.0, 8, True) is True  # then every step counts again
