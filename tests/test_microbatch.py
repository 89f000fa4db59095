"""The micro-batch choice (--micro_batch_size auto|N, vits_trainer/training/microbatch_choice.py): the
trial trains, keeps the clips of every optimiser step, survives an out-of-memory size, is kept on
resume, and is the same on every process. Timing-free: which size wins is never asserted, only that the
rules hold."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
import torch

from tests.helpers import ROOT, cli_args, cli_settings, tiny_config, train_tiny, two_cpu_processes
from vits_trainer.errors import UserError
from vits_trainer.training import loop as loop_module
from vits_trainer.training import microbatch_choice as choice_module
from vits_trainer.training.microbatch import merge_batches, micro_batches, whole_step_samples
from vits_trainer.training.microbatch_choice import MicroBatchTrial, candidates
from vits_trainer.training.step import GanStep

pytestmark = pytest.mark.slow


def record_steps(monkeypatch) -> list[dict]:
    """Each optimiser step's loader batches (clip indices) and the micro-batches they ran as."""
    steps = []
    real = loop_module.micro_batches

    def recording(pending, micro, pad=None):
        parts = real(pending, micro, pad)
        steps.append(
            {
                "indices": sorted(i for b in pending for i in b["indices"].tolist()),
                "parts": [p["input_ids"].size(0) for p in parts],
                "micro": micro,
            }
        )
        return parts

    monkeypatch.setattr(loop_module, "micro_batches", recording)
    return steps


def test_sizes_and_flag_errors(tmp_path, tiny_model_dir, tone_corpus):
    cfg = tiny_config(tmp_path, tone_corpus, tiny_model_dir, batch_size=6, gradient_accumulation_steps=4)
    assert candidates(cfg) == [6, 8, 12, 24] and cfg.forced_micro_batch() is None
    assert tiny_config(tmp_path, tone_corpus, tiny_model_dir, micro_batch_size="4").forced_micro_batch() == 4
    for bad in ("12", "32", "0", "many"):  # 12 does not divide 16, 32 exceeds it: an error, never a rounding
        with pytest.raises(UserError, match="--micro_batch_size"):
            tiny_config(
                tmp_path, tone_corpus, tiny_model_dir, gradient_accumulation_steps=2, micro_batch_size=bad
            )
    # merging and re-cutting keeps every clip, each part trimmed to its own longest clip
    a = {
        "input_ids": torch.ones(2, 3),
        "attention_mask": torch.ones(2, 3),
        "audio": torch.ones(2, 1, 5),
        "audio_lengths": torch.tensor([5, 5]),
    }
    b = {
        "input_ids": torch.ones(2, 1),
        "attention_mask": torch.ones(2, 1),
        "audio": torch.ones(2, 1, 2),
        "audio_lengths": torch.tensor([2, 2]),
    }
    merged = merge_batches([a, b])
    assert merged["audio"].shape == (4, 1, 5) and merged["audio"][2:, :, 2:].abs().sum() == 0
    parts = micro_batches([a, b], 2)
    assert [p["audio"].shape[-1] for p in parts] == [5, 2] and micro_batches([a, b], 2)[0][
        "input_ids"
    ].shape == (2, 3)
    # an OOM rules out the size and every larger one
    trial = MicroBatchTrial([8, 16, 32], 2)
    for t in (1.0, 0.5, 1.0, 0.4):
        trial.observe(trial.current(), t * 16, 16)
    trial.exclude(32)
    assert trial.done and trial.fastest() == 16 and trial.excluded == [32]


def test_the_choice_keeps_every_steps_clips(tmp_path, tiny_model_dir, tone_corpus, monkeypatch, capsys):
    steps = record_steps(monkeypatch)
    session, summary = train_tiny(
        tmp_path, tone_corpus, tiny_model_dir, gradient_accumulation_steps=2, max_steps=10
    )
    out = capsys.readouterr().out
    # 36 clips in batches of 8 (one of 4) make 3 steps an epoch, up to two short of 16 clips: those
    # measure nothing, so 4 steps each could take 16, more than --max_steps leaves: 2 each
    assert "micro-batch trial: 8, 16 clips per pass, 2 training steps each" in out
    assert "micro-batch: " in out and "the fastest in the trial" in out
    assert summary["steps"] == 10 and len(steps) == 10
    # the trial's steps train: each size a warm-up (here short: 12, then 8 clips) and one whole step
    assert [(len(s["indices"]), s["micro"]) for s in steps[:4]] == [(12, 8), (16, 8), (8, 16), (16, 16)]
    chosen = summary["micro_batch_size"]
    assert chosen in (8, 16) and summary["micro_batches_per_step"] == 16 // chosen
    assert {s["micro"] for s in steps[4:]} == {chosen}
    assert all(row["measured_steps"] == 1 for row in summary["micro_batch_trial"])
    assert [row["micro_batch_size"] for row in summary["micro_batch_trial"]] == [8, 16]
    # every step trained on exactly the clips of its two loader batches, in the sampler's order: the
    # same clips per optimiser step whatever the micro-batch
    sampler, expected = session.sampler, []
    for epoch in range(4):
        sampler.set_epoch(epoch)
        sampler.set_start(0)
        batches = list(iter(sampler))
        expected += [
            sorted(batches[k] + (batches[k + 1] if k + 1 < len(batches) else []))
            for k in range(0, len(batches), 2)
        ]
    assert [s["indices"] for s in steps] == expected[:10]
    for s in steps:
        assert sum(s["parts"]) == len(s["indices"]) and max(s["parts"]) <= s["micro"]
    state = json.loads((tmp_path / "checkpoints" / "step_00000010" / "trainer_state.json").read_text())
    assert state["micro_batch_size"] == chosen and state["micro_batches_per_step"] == 16 // chosen
    assert state["train_state"]["micro_batch_size"] == chosen


def test_the_compile_decision_gets_the_trials_eager_figure_for_the_chosen_size_only_from_this_session():
    """The compile choice compares compiled steps with the trial's eager time at the chosen size; a
    trial table kept from an earlier session measured another process (maybe another load) and is not
    used: the choice then measures eager steps itself."""
    from types import SimpleNamespace

    table = [
        {"micro_batch_size": 8, "seconds_per_sample": 0.3},
        {"micro_batch_size": 16, "seconds_per_sample": 0.2},
    ]
    policy = object.__new__(choice_module.MicroBatchPolicy)
    policy.s = SimpleNamespace(state=SimpleNamespace(micro_batch_size=16, micro_batch_trial=table))
    policy.trial_steps = [(8, 2.4, 8, True), (16, 3.2, 16, True)]
    assert policy.trial_seconds_per_sample() == 0.2
    policy.trial_steps = []  # resumed: the table is an earlier session's
    assert policy.trial_seconds_per_sample() is None


def test_each_sizes_first_trial_step_is_a_warm_up_not_a_measurement():
    # The first step at a new size allocates (and on a GPU autotunes) for its shapes: counted as
    # measured, a slow first step at 16 made 8 look fastest although 16 is faster on every later step.
    trial = MicroBatchTrial([8, 16], 2)
    for size, per_sample in ((8, [0.5, 0.30]), (16, [2.0, 0.20])):
        for t in per_sample:
            trial.observe(size, t * 16, 16)
    assert trial.done
    assert trial.seconds_per_sample(8) == pytest.approx(0.30)
    assert trial.seconds_per_sample(16) == pytest.approx(0.20)
    assert trial.fastest() == 16
    one = MicroBatchTrial([8], 1)
    one.observe(8, 1.6, 16)
    assert one.seconds_per_sample(8) is None and one.fastest() is None  # its warm-up step alone: no figure


def trial_policy(sizes, steps, step_clips=16, batch_size=8):
    """A MicroBatchPolicy running a trial of `sizes`, without a session: its log lines in `.lines`."""
    from types import SimpleNamespace

    policy = object.__new__(choice_module.MicroBatchPolicy)
    policy.lines = []
    policy.s = SimpleNamespace(
        state=SimpleNamespace(micro_batch_size=None, micro_batch_trial=None, split=1),
        cfg=SimpleNamespace(batch_size=batch_size),
        budget=SimpleNamespace(global_step=0, add_measurements=lambda m: None),
        log=policy.lines.append,
        accelerator=SimpleNamespace(num_processes=1),
    )
    policy.agreement = SimpleNamespace(integer=lambda x: x)
    policy.metrics = SimpleNamespace(write=lambda record: None)
    policy.step_clips = policy.effective_step_clips = step_clips
    policy.whole_step_samples = step_clips  # an epoch of many steps: each trains a whole one
    policy.trial, policy.trial_steps = MicroBatchTrial(sizes, steps), []
    return policy


def test_a_whole_steps_clips_are_one_rule_for_the_budget_and_each_process():
    """An epoch of 5 clips, smaller than a step of 8 clips per process on 2 processes: each step trains
    the whole epoch, 5 samples (the budget's full step), and the busiest process at least 3 of them. The
    per-process count was the epoch divided rounding down, min(8, 5 // 2) = 2: 4 samples a step, fewer
    than the budget's 5. With one process, or an epoch of whole steps, the rules always agreed."""
    from types import SimpleNamespace

    def policy(processes: int, epoch: int):
        session = SimpleNamespace(
            cfg=SimpleNamespace(step_clips=8),
            accelerator=SimpleNamespace(num_processes=processes),
            data=SimpleNamespace(samples_per_epoch=epoch),
        )
        return choice_module.MicroBatchPolicy(session, metrics=None, agreement=None)

    small = policy(2, 5)
    assert small.whole_step_samples == whole_step_samples(8, 2, 5) == 5
    assert small.clips_trained_per_step() == 3
    assert policy(1, 5).clips_trained_per_step() == 5
    assert policy(2, 100).whole_step_samples == 16 and policy(2, 100).clips_trained_per_step() == 8


def test_an_epochs_short_steps_do_not_take_a_sizes_measured_steps():
    """36 clips, 16 per step: every third step is an epoch's short last one (4 clips), which measures
    no size. It took size 8's measured slot, and 16 was then "the fastest" from its figures alone."""
    policy = trial_policy([8, 16], 2)
    clips = iter([16, 4, 16, 16, 4, 16, 16, 4, 16])
    while policy.trial is not None:
        size = policy.trial.current()
        n = next(clips)
        policy.observe_trial_step(size, (0.1 if size == 8 else 0.2) * n, n, True)  # 8 is the faster
    assert policy.s.state.micro_batch_size == 8
    rows = {r["micro_batch_size"]: r for r in policy.s.state.micro_batch_trial}
    assert rows[8]["measured_steps"] == 1 and rows[16]["measured_steps"] == 1
    assert [size for size, *_ in policy.trial_steps] == [8, 8, 8, 16, 16, 16]  # each: two whole steps


def test_a_trial_of_short_steps_ends_and_does_not_call_an_unmeasured_size_the_fastest():
    """Only short steps (an epoch can have two, around one whole step; here none): each size gives up
    after twice its steps, and the choice says no size was measured."""
    policy = trial_policy([8, 16], 2)
    for _ in range(20):
        if policy.trial is None:
            break
        policy.observe_trial_step(policy.trial.current(), 0.4, 4, True)
    assert policy.trial is None and len(policy.trial_steps) <= 2 * 2 * 2
    assert policy.s.state.micro_batch_size == 8  # --batch_size
    assert not any("the fastest" in line for line in policy.lines)
    assert any("no size was measured" in line for line in policy.lines)
    # one size measured, the other not: the choice says it was the only one measured
    policy = trial_policy([8, 16], 2)
    for n in [4, 4, 4, 4, 16, 16]:
        policy.observe_trial_step(policy.trial.current(), 0.2 * n, n, True)
    assert policy.trial is None and policy.s.state.micro_batch_size == 16
    assert any("the only size measured (8 was not)" in line for line in policy.lines), policy.lines


def test_a_run_ending_on_the_trials_last_step_reports_the_chosen_size():
    """max_steps can end a run on the trial's last step, which ran the largest size tried; the summary
    and checkpoints report the size chosen (here 16 of 8 x 4 clips), not that one."""
    from types import SimpleNamespace

    policy = object.__new__(choice_module.MicroBatchPolicy)
    policy.s = SimpleNamespace(
        state=SimpleNamespace(micro_batch_size=16, split=1),
        cfg=SimpleNamespace(batch_size=8),
        accelerator=SimpleNamespace(num_processes=1),
    )
    policy.trial, policy.last_micro, policy.step_clips, policy.whole_step_samples = None, 32, 32, 32
    assert policy.used() == {"micro_batch_size": 16, "micro_batches_per_step": 2}
    policy.s.state.split = 2  # after an out-of-memory split, the halved size
    assert policy.used() == {"micro_batch_size": 8, "micro_batches_per_step": 4}
    policy.trial = MicroBatchTrial([8, 16, 32], 4)  # while the trial runs: the last step's size
    assert policy.used()["micro_batch_size"] == 32


def test_simulated_out_of_memory_rules_a_size_out(tmp_path, tiny_model_dir, tone_corpus, monkeypatch, capsys):
    real = GanStep.micro_step

    def small_only(self, batch, first, last, scale):
        if batch["input_ids"].size(0) > 8:  # simulated: no GPU here, so a real OOM cannot happen
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(self, batch, first, last, scale)

    monkeypatch.setattr(GanStep, "micro_step", small_only)
    session, summary = train_tiny(
        tmp_path, tone_corpus, tiny_model_dir, gradient_accumulation_steps=2, max_steps=10
    )
    out = capsys.readouterr().out
    # 2 steps a size (short steps make 4 too many for --max_steps): steps 1-2 at 8 clips, then 16 at
    # step 3 (short: 8 clips, one pass that fits) and step 4 (16 clips)
    assert "micro-batch trial: 16 clips ran out of memory at step 4: ruled out" in out
    assert "16 clips: out of memory" in out
    assert summary["steps"] == 10 and summary["skipped_steps"] == 0  # training went on
    assert summary["micro_batch_size"] == 8 and summary["micro_batches_per_step"] == 2
    assert session.state.split == 1  # the trial's OOM did not halve the chosen size
    rows = {r["micro_batch_size"]: r for r in summary["micro_batch_trial"]}
    assert rows[16]["out_of_memory"] and not rows[8]["out_of_memory"]


def test_resume_keeps_the_choice_unless_the_hardware_changed(
    tmp_path, tiny_model_dir, tone_corpus, monkeypatch, capsys
):
    _, first = train_tiny(tmp_path, tone_corpus, tiny_model_dir, gradient_accumulation_steps=2, max_steps=9)
    chosen = first["micro_batch_size"]
    capsys.readouterr()
    steps = record_steps(monkeypatch)
    _, second = train_tiny(tmp_path, tone_corpus, tiny_model_dir, gradient_accumulation_steps=2, max_steps=11)
    out = capsys.readouterr().out
    assert "chosen earlier on this hardware" in out and "micro-batch trial" not in out
    assert second["micro_batch_size"] == chosen and {s["micro"] for s in steps} == {chosen}
    assert second["micro_batch_trial"] == first["micro_batch_trial"]
    # --micro_batch_size N wins on resume
    _, forced = train_tiny(
        tmp_path,
        tone_corpus,
        tiny_model_dir,
        gradient_accumulation_steps=2,
        max_steps=12,
        micro_batch_size="4",
    )
    assert "(--micro_batch_size 4)" in capsys.readouterr().out and forced["micro_batch_size"] == 4
    # no trial chose 4: its table goes, so a later `auto` session runs a trial (not "chosen earlier")
    assert forced["micro_batch_trial"] is None
    # other hardware: a new trial
    monkeypatch.setattr(choice_module, "hardware_id", lambda device: "cuda: another machine; 64 CPUs")
    _, moved = train_tiny(tmp_path, tone_corpus, tiny_model_dir, gradient_accumulation_steps=2, max_steps=20)
    out = capsys.readouterr().out
    assert "the hardware changed" in out and "micro-batch trial: 8, 16 clips per pass" in out
    assert moved["steps"] == 20 and moved["micro_batch_size"] in (8, 16)


def test_a_short_run_skips_the_trial(tmp_path, tiny_model_dir, tone_corpus, capsys):
    _, summary = train_tiny(tmp_path, tone_corpus, tiny_model_dir, gradient_accumulation_steps=2, max_steps=3)
    out = capsys.readouterr().out
    assert "micro-batch trial skipped (--max_steps leaves 3 steps, it needs 8)" in out
    assert summary["micro_batch_size"] == 8 and summary["micro_batch_trial"] is None
    # resumed with room for it: no trial chose the size in use, so this session runs one
    _, resumed = train_tiny(
        tmp_path, tone_corpus, tiny_model_dir, gradient_accumulation_steps=2, max_steps=12
    )
    out = capsys.readouterr().out
    assert "chosen earlier" not in out and "micro-batch trial: 8, 16 clips per pass" in out
    assert resumed["steps"] == 12 and resumed["micro_batch_trial"] is not None


def test_two_processes_agree_on_one_choice(tmp_path, tiny_model_dir, tone_corpus):
    # --max_steps ends the run, not a budget: a 0.15 h one could leave the trial (at most 20 % of the training
    # time left) too little on a loaded machine: shortened, or skipped, as its steps slowed
    settings = cli_settings(
        tmp_path, tone_corpus, tiny_model_dir, gradient_accumulation_steps=2, max_steps=10
    )
    cmd = [*two_cpu_processes(ROOT / "tests" / "mp_microbatch.py", 29547), *cli_args(settings)]
    env = dict(os.environ, MICRO_OUT=str(tmp_path))
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "cpu:0 ×2" in proc.stdout and "micro-batch trial: 8, 16 clips per pass" in proc.stdout
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    # rank 1's own timings favour 16; rank 0 decides (8) and both train with it
    assert ranks[0] == ranks[1] == {"chosen": 8, "last": 8}


def test_each_micro_batch_weighs_its_share_of_the_steps_clips(
    tmp_path, tiny_model_dir, tone_corpus, monkeypatch
):
    """A micro-batch's losses are means over its own clips, so its weight in the step's gradient is its
    share of the step's clips: 37 clips in batches of 8 end each epoch with a batch of 5, cut at
    micro-batch 4 into 2 + 3 clips; weighted 1/2 each, the 2 clips counted as much as the 3."""
    seen = []  # per optimiser step: (clips, scale) of each micro-batch
    real = GanStep.micro_step

    def recording(self, batch, first, last, scale):
        if first:
            seen.append([])
        seen[-1].append((batch["input_ids"].size(0), scale))
        return real(self, batch, first, last, scale)

    monkeypatch.setattr(GanStep, "micro_step", recording)
    _, summary = train_tiny(
        tmp_path,
        tone_corpus,
        tiny_model_dir,
        max_samples=37,
        val_fraction=0.0,
        micro_batch_size="4",
        max_steps=5,
    )
    assert summary["steps"] == 5 and len(seen) == 5
    assert sorted(tuple(n for n, _ in step) for step in seen) == [(2, 3)] + [(4, 4)] * 4
    for step in seen:
        clips = sum(n for n, _ in step)
        assert [scale for _, scale in step] == pytest.approx([n / clips for n, _ in step])


def test_a_windows_losses_are_means_over_its_clips():
    """The logged losses weigh each micro-batch by its clips (a plain mean of parts counted 1 clip of a
    3 + 1 cut as much as the 3); a gradient norm, one per step, by its step's clips."""
    window = loop_module.StepWindow()
    t = torch.tensor
    window.add_cycle([{"mel": t(1.0)}, {"mel": t(5.0), "grad_norm_g": t(2.0)}], [3, 1])
    assert window.means() == pytest.approx({"mel": 2.0, "grad_norm_g": 2.0})
    window.add_cycle([{"mel": t(0.0), "grad_norm_g": t(5.0)}], [4])  # a step of one micro-batch
    assert window.means() == pytest.approx({"mel": 1.0, "grad_norm_g": 3.5})


def test_gan_step_called_with_the_cycles_clips_weighs_each_part_by_its_share():
    step = object.__new__(GanStep)  # no networks: only the weight it passes on is checked
    calls = []
    step.micro_step = lambda batch, first, last, scale: calls.append((first, last, scale))
    for i, n in enumerate((3, 1)):
        step({"input_ids": torch.zeros(n, 2)}, micro_index=i, cycle_length=2, cycle_clips=4)
    step({"input_ids": torch.zeros(3, 2)}, micro_index=0, cycle_length=2)  # equal parts: 1 / 2
    assert calls == [(True, False, 0.75), (False, True, 0.25), (True, False, 0.5)]


def test_an_epoch_smaller_than_a_step_reports_the_micro_batches_it_runs(
    tmp_path, tiny_model_dir, monkeypatch, capsys
):
    """6 training clips, a step of 8 (--batch_size 8): each step trains on those 6. With
    --micro_batch_size 2 that is 3 passes of 2, not the 4 a full step would take: the log line and
    train_summary.json say the 3 the run did (they said 8 clips and 4 passes)."""
    from vits_trainer.data.synthetic import make_corpus

    make_corpus(tmp_path / "data", num_clips=6, sample_rate=16000, seed=1)
    steps = record_steps(monkeypatch)
    _, summary = train_tiny(
        tmp_path, tmp_path / "data", tiny_model_dir, val_fraction=0, micro_batch_size="2", max_steps=1
    )
    out = capsys.readouterr().out
    assert [s["parts"] for s in steps] == [[2, 2, 2]]
    assert "micro-batch: 2 clips x 3 (gradient accumulation) = 6 clips per optimiser step" in out, out
    assert summary["micro_batch_size"] == 2 and summary["micro_batches_per_step"] == 3
