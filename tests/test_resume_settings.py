"""A resumed run keeps its own settings unless a flag is given; the resume command printed after a
signal is complete (running exactly it continues the run with the first run's settings)."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import time

import pytest

from tests.helpers import PYTHON, ROOT, cli_args, cli_settings
from vits_trainer.errors import ArgumentParser
from vits_trainer.training.config import TrainConfig, add_arguments, parse_config
from vits_trainer.training.resume_settings import restore_settings, resume_command


def parse(argv: list[str]) -> TrainConfig:
    parser = ArgumentParser()
    add_arguments(parser, TrainConfig)
    return parse_config(parser, argv, TrainConfig)


def test_explicit_flags_include_those_equal_to_their_default():
    cfg = parse(["--learning_rate", "2e-5", "--fp16", "--no-cpu", "--target_hours", "1"])
    assert cfg.explicit == {"learning_rate", "mixed_precision", "cpu", "target_hours"}
    assert cfg.learning_rate == 2e-5 and cfg.mixed_precision == "fp16" and cfg.target_hours == 1
    assert "explicit" not in cfg.to_dict()  # never saved as a setting of the run


def test_saved_settings_win_unless_a_flag_is_given():
    saved = TrainConfig(
        learning_rate=2e-4,
        gradient_accumulation_steps=1,
        warmup_steps=20,
        output_dir="elsewhere/model",
        target_hours=0.1,
        num_workers=0,
        gradient_checkpointing=True,
        overwrite_output_dir=True,
    ).to_dict()
    cfg = parse(
        [
            "--learning_rate",
            "1e-4",
            "--target_hours",
            "2",
            "--warmup_steps",
            "20",
            "--no-overwrite_output_dir",
        ]
    )
    lines = []
    merged = restore_settings(cfg, saved, lines.append, source="step_00000072")
    assert merged.learning_rate == 1e-4  # given: kept, and said
    assert "resume: --learning_rate 0.0001 (the checkpoint's run used 0.0002)" in lines
    assert merged.gradient_accumulation_steps == 1 and merged.output_dir == "elsewhere/model"
    assert merged.warmup_steps == 20 and not any("warmup" in x for x in lines[:-1])  # equal: no line
    assert merged.target_hours == 2 and merged.num_workers == 2  # this session's budget, this machine
    assert "--gradient_accumulation_steps 1" in lines[-1] and "--output_dir elsewhere/model" in lines[-1]
    # a switch as it is typed (it read "--gradient_checkpointing True")
    assert "--gradient_checkpointing," in lines[-1] and "True" not in lines[-1]
    assert "resume: --no-overwrite_output_dir (the checkpoint's run used --overwrite_output_dir)" in lines
    # a setting the run never set reads "none", not Python's None
    unset_total = restore_settings(parse(["--total_hours", "0.5"]), saved, lines.append, source="x")
    assert unset_total.total_hours == 0.5
    assert "resume: --total_hours 0.5 (the checkpoint's run used none)" in lines
    built_in_code = TrainConfig(learning_rate=3e-4)
    assert restore_settings(built_in_code, saved, lines.append, source="x") is built_in_code


def test_a_resume_from_another_folder_keeps_the_runs_relative_folders(tmp_path, monkeypatch):
    """A run started in A with the default "training" folders, resumed from B (which has a "training"
    folder of its own) with --checkpoint_dir A/training/checkpoints: it trained on B's corpus and
    exported into B, saying nothing. A project folder copied whole and resumed inside the copy keeps
    using the copy's folders."""
    saved = TrainConfig(
        data_dir="training", output_dir="training/final_model", checkpoint_dir="training/checkpoints"
    ).to_dict()
    run_a, here = tmp_path / "A", tmp_path / "B"
    run_a.mkdir()
    here.mkdir()
    monkeypatch.chdir(here)
    lines = []
    given = parse(["--checkpoint_dir", str(run_a / "training" / "checkpoints")])
    merged = restore_settings(given, saved, lines.append, source="step_00000080", working_dir=str(run_a))
    assert merged.data_dir == str(run_a / "training")
    assert merged.output_dir == str(run_a / "training" / "final_model")
    assert f"--data_dir {run_a / 'training'}" in lines[-1]
    # found by where the checkpoints are, also in a checkpoint that does not say where its run ran
    merged = restore_settings(given, saved, lines.append, "x", working_dir=None)
    assert merged.data_dir == str(run_a / "training")
    # the copy of the project, resumed inside it (default --checkpoint_dir), or in the folder it ran in
    for working_dir in (str(run_a), str(here), None):
        assert (
            restore_settings(parse([]), saved, lines.append, "x", working_dir=working_dir).data_dir
            == "training"
        )
    # a checkpoint folder not found where the run's relative one would be: the folder the run ran in
    elsewhere = parse(["--checkpoint_dir", str(tmp_path / "moved")])
    merged = restore_settings(elsewhere, saved, lines.append, "x", working_dir=str(run_a))
    assert merged.data_dir == str(run_a / "training")
    # a folder given on this command line wins
    merged = restore_settings(parse(["--data_dir", "mine", *given_args(given)]), saved, lines.append, "x")
    assert merged.data_dir == "mine"
    # a run's folder that is gone (moved, resumed from its old checkpoints' copy) names nothing
    merged = restore_settings(elsewhere, saved, lines.append, "x", working_dir=str(tmp_path / "gone"))
    assert merged.data_dir == "training"


def test_a_feedback_resume_from_another_folder_keeps_the_rounds_relative_folders(tmp_path, monkeypatch):
    """train_feedback.py started in A with relative folders, resumed from B with --output_dir pointing
    back into A: its corpus, feedback clips and base model are A's (the round finds the run's folder
    from where the version's checkpoints are, feedback/round.py), not B's folders of the same names."""
    import dataclasses

    from vits_trainer.feedback.config import HIDDEN_FLAGS, FeedbackConfig

    saved = FeedbackConfig(
        data_dir="training",
        feedback_dir="feedback",
        base_model="training/checkpoints/best_model",
        output_dir="feedback_runs/v1/model",
        checkpoint_dir="feedback_runs/v1/checkpoints",
    ).to_dict()
    run_a, here = tmp_path / "A", tmp_path / "B"
    run_a.mkdir()
    here.mkdir()
    monkeypatch.chdir(here)
    parser = ArgumentParser()
    add_arguments(parser, FeedbackConfig, skip=HIDDEN_FLAGS)
    given = parse_config(parser, ["--output_dir", str(run_a / "feedback_runs")], FeedbackConfig)
    version = dataclasses.replace(given, checkpoint_dir=str(run_a / "feedback_runs" / "v1" / "checkpoints"))
    keep = frozenset({"output_dir", *HIDDEN_FLAGS})
    merged = restore_settings(version, saved, [].append, "x", keep=keep, working_dir=str(run_a))
    assert merged.data_dir == str(run_a / "training")
    assert merged.feedback_dir == str(run_a / "feedback")
    assert merged.base_model == str(run_a / "training" / "checkpoints" / "best_model")
    assert merged.output_dir == str(run_a / "feedback_runs")  # the root given, kept
    # resumed inside A (or a copy of it): the folders as saved
    monkeypatch.chdir(run_a)
    merged = restore_settings(version, saved, [].append, "x", keep=keep, working_dir=str(run_a))
    assert (merged.data_dir, merged.feedback_dir) == ("training", "feedback")


def test_a_resumed_feedback_version_keeps_the_base_it_started_from():
    """Another --base_model given to a resumed version was printed as winning and named as the base in the
    version's model card, while its weights continued from the base it started from."""
    from vits_trainer.feedback.config import HIDDEN_FLAGS, FeedbackConfig

    saved = FeedbackConfig(base_model="/m/best_model").to_dict()
    parser = ArgumentParser()
    add_arguments(parser, FeedbackConfig, skip=HIDDEN_FLAGS)
    given = parse_config(parser, ["--base_model", "/other/model"], FeedbackConfig)
    lines = []
    keep = frozenset({"output_dir", *HIDDEN_FLAGS})
    merged = restore_settings(given, saved, lines.append, "step_00000012", keep=keep)
    assert merged.base_model == "/m/best_model"
    assert lines == [
        "resume: --base_model /other/model is not used: this run continues its checkpoint, trained from "
        "/m/best_model; to start a new version from /other/model, add --resume none"
    ]


def given_args(cfg) -> list[str]:
    return ["--checkpoint_dir", cfg.checkpoint_dir]


def test_settings_fixed_for_the_run_are_kept_and_said_to_be_unused():
    """--val_fraction and --seed given on resume were printed like a flag that takes effect, then saved as
    the run's settings, while the checkpoint's validation clips and random state were used."""
    saved = TrainConfig(val_fraction=0.02, seed=0).to_dict()
    lines = []
    cfg = parse(["--val_fraction", "0.2", "--seed", "7", "--learning_rate", "1e-4"])
    merged = restore_settings(cfg, saved, lines.append, source="step_00000010")
    assert merged.val_fraction == 0.02 and merged.seed == 0 and merged.learning_rate == 1e-4
    assert "resume: --val_fraction 0.2 is not used: the validation clips are the checkpoint's" in lines[1]
    assert "resume: --seed 7 is not used: the random state is the checkpoint's (0 in this run)" in lines
    assert not any("--val_fraction 0.2 (the checkpoint" in line for line in lines)
    # the vocabulary and the discriminator were printed as winning, while the checkpoint's were used
    lines = []
    cfg = parse(["--extend_vocab", "--discriminator_width", "0.25", "--discriminator", "elsewhere"])
    merged = restore_settings(cfg, saved, lines.append, source="step_00000010")
    assert (merged.extend_vocab, merged.discriminator_width, merged.discriminator) == (False, 1.0, "")
    assert "resume: --extend_vocab is not used: the vocabulary is the checkpoint's" in " ".join(lines)
    assert (
        "resume: --discriminator elsewhere is not used: the discriminator is the checkpoint's (none"
        in lines[0]
    )
    assert (
        "resume: --discriminator_width 0.25 is not used: the discriminator is the checkpoint's (1.0"
        in " ".join(lines)
    )


def test_num_speakers_given_on_resume_is_said_to_be_unused():
    """--num_speakers 2 on a resumed one-voice run was printed as winning ("the checkpoint's run used
    ''") and saved as the run's setting, while the checkpoint's model and speaker map were kept: the model
    still had one voice."""
    saved = TrainConfig(num_speakers="").to_dict()
    lines = []
    merged = restore_settings(parse(["--num_speakers", "2"]), saved, lines.append, source="step_00000002")
    assert merged.num_speakers == ""
    assert lines[0].startswith("resume: --num_speakers 2 is not used: the voices are the checkpoint's")
    assert not any("(the checkpoint's run used" in line for line in lines)
    lines = []  # a one-voice run given --num_speakers auto on resume: its model's own count
    restore_settings(parse(["--num_speakers", "auto"]), TrainConfig().to_dict(), lines.append, source="s")
    assert lines[0].endswith("(the model's own in this run)"), lines


def test_a_resumed_run_keeps_the_model_it_was_trained_from():
    """The weights are the checkpoint's: another --model_name would only have named the wrong base in
    the model card (and its license and language)."""
    saved = TrainConfig(model_name="facebook/mms-tts-kmr-script_latin").to_dict()
    lines = []
    merged = restore_settings(parse(["--model_name", "nosuch"]), saved, lines.append, source="step_00000156")
    assert merged.model_name == "facebook/mms-tts-kmr-script_latin"
    assert lines == [
        "resume: --model_name nosuch is not used: this run continues its checkpoint, trained from "
        "facebook/mms-tts-kmr-script_latin; to train nosuch from the start, give another --checkpoint_dir"
    ]


def test_a_resumed_run_keeps_the_precision_a_recovery_moved_it_to():
    """bf16 on this CPU; an earlier session's recovery moved the run to fp32 ("no"): kept, and said."""
    from vits_trainer.training.session import _resumed_state

    lines = []
    cfg = parse(["--bf16", "--cpu"])
    state, precision = _resumed_state(cfg, object(), {"train_state": {"precision": "no"}}, lines.append)
    assert precision == "no" and state.precision == "no"
    assert lines == [
        "precision: no, not bf16: an earlier session's recovery moved the run off bf16 after repeated "
        "non-finite steps (kept for this session)"
    ]
    _, precision = _resumed_state(cfg, None, {}, lines.append)  # a new run: what was asked
    assert precision == "bf16" and len(lines) == 1


def test_a_recoverys_bf16_is_not_forced_onto_a_gpu_without_it(monkeypatch):
    """A run that a recovery moved from fp16 to bf16 on an A100, resumed on a T4 (fp16 here, bf16 only
    emulated): it trains in fp32, the rung after fp16 on this GPU, not in a slow emulated bf16. The GPU
    is a stand-in (resolve_precision's answer on a T4)."""
    from types import SimpleNamespace

    import vits_trainer.training.session as session_module

    state = {"train_state": {"precision": "bf16"}}
    cfg = SimpleNamespace(mixed_precision="auto", cpu=False)
    lines = []
    monkeypatch.setattr(session_module, "resolve_precision", lambda *a, **k: "fp16")  # a T4
    assert session_module._resumed_state(cfg, object(), state, lines.append)[1] == "no"
    assert lines == [
        "precision: no, not fp16: an earlier session's recovery moved the run off fp16 after repeated "
        "non-finite steps (kept for this session)"
    ]
    monkeypatch.setattr(session_module, "resolve_precision", lambda *a, **k: "bf16")  # an A100 again
    assert session_module._resumed_state(cfg, object(), state, lines.append)[1] == "bf16"


def test_resume_command_names_this_machines_settings():
    cfg = TrainConfig(checkpoint_dir="my runs/ckpt", num_workers=0, cpu=True, learning_rate=1.0)
    assert resume_command("train_vits.py", cfg, "--checkpoint_dir", cfg.checkpoint_dir) == (
        "python train_vits.py --resume auto --checkpoint_dir 'my runs/ckpt' --num_workers 0 --cpu "
        "--target_hours 9.5"  # this session's budget: the command runs as pasted (it said "H")
    )


def test_resume_command_of_several_processes_launches_as_many(monkeypatch):
    """A 2-process run stopped by a signal once printed `python train_vits.py ...`: pasted, it went on
    with one process."""
    monkeypatch.setenv("WORLD_SIZE", "2")  # accelerate launch's processes
    cfg = TrainConfig(checkpoint_dir="ck")
    assert resume_command("train_vits.py", cfg, "--checkpoint_dir", "ck").startswith(
        "accelerate launch --num_processes 2 train_vits.py --resume auto --checkpoint_dir ck"
    )
    cfg = TrainConfig(checkpoint_dir="ck", cpu=True)  # gloo processes need --multi_gpu
    assert resume_command("train_vits.py", cfg, "--checkpoint_dir", "ck").startswith(
        "accelerate launch --multi_gpu --num_processes 2 train_vits.py"
    )


@pytest.mark.slow
def test_printed_resume_command_continues_with_the_same_settings(tmp_path, tiny_model_dir, tone_corpus):
    """A demo-style run (tiny model, its own LR / accumulation / warmup / output folder, all far from
    the defaults) stopped by SIGTERM, then continued with exactly the command it printed."""
    settings = cli_settings(tmp_path, tone_corpus, tiny_model_dir, log_every=1, save_minutes=0.25)
    settings["output_dir"] = tmp_path / "my_model"
    proc = subprocess.Popen(
        [PYTHON, str(ROOT / "train_vits.py"), *cli_args(settings), "--target_hours", str(300 / 3600)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    metrics = tmp_path / "checkpoints" / "metrics.jsonl"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None:
        if metrics.exists() and '"loss_g"' in metrics.read_text():
            break
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]
    printed = next(x for x in out.splitlines() if "continue with: " in x).split("continue with: ", 1)[1]
    argv = shlex.split(printed)
    assert argv[:2] == ["python", "train_vits.py"]
    stopped = json.loads((tmp_path / "checkpoints" / "train_summary.json").read_text())["steps"]
    state = json.loads((tmp_path / "checkpoints" / f"step_{stopped:08d}" / "trainer_state.json").read_text())
    first = state["config"]
    assert state["working_dir"] == os.getcwd()  # what a relative --data_dir is relative to

    at = argv.index("--target_hours")
    assert float(argv[at + 1]) == pytest.approx(300 / 3600, rel=1e-4)  # this session's, to paste as is
    argv[at + 1] = str(120 / 3600)
    # ended by a step count, not by spending the budget: a flag given at resume wins over the run's own
    argv = [*argv[2:], "--max_steps", str(stopped + 2)]
    resumed = subprocess.run(
        [PYTHON, str(ROOT / "train_vits.py"), *argv], capture_output=True, text=True, timeout=400
    )
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    assert f"resuming from step_{stopped:08d}" in resumed.stdout
    assert "the run's own settings" in resumed.stdout
    summary = json.loads((tmp_path / "my_model" / "train_summary.json").read_text())  # the first run's folder
    assert summary["resumed_from_step"] == stopped
    assert summary["steps"] == stopped + 2 and summary["stopped_reason"] == "max_steps"
    again = json.loads(
        (tmp_path / "checkpoints" / f"step_{summary['steps']:08d}" / "trainer_state.json").read_text()
    )["config"]
    for name in (
        "learning_rate",
        "gradient_accumulation_steps",
        "warmup_steps",
        "batch_size",
        "output_dir",
        "data_dir",
        "seed",
        "val_fraction",
        "num_workers",
        "cpu",
    ):
        assert again[name] == first[name], name


def test_a_whole_training_without_a_checkpoint_says_so_and_how_to_continue_one_from_elsewhere(tmp_path):
    # the trap of a new Kaggle session: the same command as session 1 on a machine without its files
    # would start the --total_hours training afresh without a word
    from vits_trainer.training.checkpoint import write_checkpoint
    from vits_trainer.training.session import find_checkpoint

    cfg = parse(["--total_hours", "28", "--target_hours", "9.5"])
    logs: list[str] = []
    assert find_checkpoint(cfg, tmp_path / "checkpoints", logs.append) is None
    assert logs == [
        f"note: no checkpoint in {tmp_path / 'checkpoints'}, so the 28 hours of --total_hours start now; "
        "to continue a training saved elsewhere (a new Kaggle session), pass --resume "
        "<its checkpoints>/step_N"
    ]
    logs.clear()
    assert find_checkpoint(parse(["--target_hours", "9.5"]), tmp_path / "checkpoints", logs.append) is None
    write_checkpoint(tmp_path / "checkpoints", 7, {"a.bin": b"x"})
    assert find_checkpoint(cfg, tmp_path / "checkpoints", logs.append).step == 7
    assert not any("note: no checkpoint" in line for line in logs)  # one session of one run: nothing to say


def test_a_resumed_runs_data_folder_missing_on_this_machine_says_to_pass_data_dir(tmp_path):
    # a new Kaggle machine: the checkpoint's run prepared its data in a folder this machine lacks
    from vits_trainer.errors import UserError
    from vits_trainer.training.checkpoint import write_checkpoint
    from vits_trainer.training.session import build_session

    gone = tmp_path / "earlier_machine" / "training"
    state = {"config": {"data_dir": str(gone)}}
    step = write_checkpoint(tmp_path / "copy", 5, {"trainer_state.json": json.dumps(state).encode()})
    argv = ["--resume", str(step), "--checkpoint_dir", str(tmp_path / "checkpoints"), "--target_hours", "1"]
    with pytest.raises(UserError) as refused:
        build_session(parse(argv), time.time())
    assert str(refused.value) == (
        f"--data_dir {gone}: no such folder (run prepare_data.py first); it is the resumed run's own "
        "--data_dir, from its checkpoint: on another machine, pass --data_dir where that data is now"
    )
    with pytest.raises(UserError) as given:  # a folder the user named is their own mistake: no such words
        build_session(parse([*argv, "--data_dir", str(gone)]), time.time())
    assert "resumed run's own" not in str(given.value)
    assert not (tmp_path / "checkpoints").exists()  # bad input writes nothing


def test_a_resumed_runs_output_folder_unusable_here_says_to_pass_output_dir(
    tmp_path, tiny_model_dir, tone_corpus
):
    # the final model's folder of the checkpoint's run cannot be made on this machine (here: its parent
    # is a file): said before training, with the flag that mends it, not after hours at the export
    import shutil

    from tests.helpers import train_tiny
    from vits_trainer.errors import UserError
    from vits_trainer.training.session import build_session

    out = tmp_path / "out"
    _, summary = train_tiny(tmp_path, tone_corpus, tiny_model_dir, max_steps=1, output_dir=str(out / "m"))
    shutil.rmtree(out)
    out.write_text("not a folder", encoding="utf-8")
    argv = [
        "--resume",
        summary["last_checkpoint"],
        "--checkpoint_dir",
        str(tmp_path / "more"),
        "--target_hours",
        "1",
    ]
    with pytest.raises(UserError) as refused:
        build_session(parse(argv), time.time())
    assert str(refused.value).startswith(f"--output_dir's parent folder {out} is not writable (")
    assert str(refused.value).endswith(
        "it is the resumed run's own --output_dir, from its checkpoint: on another machine, pass "
        "--output_dir where the final model should go"
    )
    assert not (tmp_path / "more").exists()  # refused before writing
    with pytest.raises(UserError) as given:  # a folder the user named is their own mistake: no such words
        build_session(parse([*argv, "--output_dir", str(out / "m")]), time.time())
    assert "resumed run's own" not in str(given.value)


@pytest.mark.parametrize("before, after", [(2, 1), (1, 2)])
def test_a_mid_epoch_resume_with_another_process_count_trains_each_batch_once(before, after):
    """Each rank counts its own batches of the epoch, dealt out in turn. Resumed with another process
    count, the position is converted: the batches trained before and after together are the epoch's,
    none twice (2 -> 1 trained the first ones twice; 1 -> 2 skipped half of those after them)."""
    from vits_trainer.data.sampler import BucketBatchSampler
    from vits_trainer.training.session import rescale_epoch_position
    from vits_trainer.training.trainstate import TrainState

    lengths = [100 + (k * 37) % 400 for k in range(96)]  # 24 batches of 4

    def batches(replicas: int, rank: int, start: int = 0) -> list[tuple[int, ...]]:
        sampler = BucketBatchSampler(lengths, 4, seed=3, num_replicas=replicas, rank=rank)
        sampler.set_epoch(5)
        sampler.set_start(start)
        return [tuple(b) for b in sampler]

    trained_per_rank = 6
    done = [b for rank in range(before) for b in batches(before, rank)[:trained_per_rank]]
    state = TrainState(epoch=5, batch_in_epoch=trained_per_rank, processes=before)
    lines = []
    rescale_epoch_position(state, after, lines.append)
    rest = [b for rank in range(after) for b in batches(after, rank, state.batch_in_epoch)]
    assert sorted(done + rest) == sorted(batches(1, 0)) and len(set(done + rest)) == 24
    assert state.processes == after and len(lines) == 1 and lines[0].startswith("resume: ")
    same = TrainState(batch_in_epoch=6, processes=2)
    rescale_epoch_position(same, 2, lines.append)  # the same count, or an older checkpoint: as saved
    old = TrainState(batch_in_epoch=6)
    rescale_epoch_position(old, 1, lines.append)
    assert (same.batch_in_epoch, old.batch_in_epoch, old.processes, len(lines)) == (6, 6, 1, 1)


def test_a_mid_epoch_resume_with_another_batch_size_starts_the_epoch_again():
    """Another --batch_size groups the epoch anew: no batch position maps, the epoch starts again (batch
    4 -> 8 at batch 6 skipped clips of the epoch and trained others twice). With another process count
    too, the position is not converted first: one line, the epoch from its beginning."""
    from vits_trainer.training.session import rescale_epoch_position, restart_epoch_if_regrouped
    from vits_trainer.training.trainstate import TrainState

    lines = []
    regrouped = TrainState(epoch=5, batch_in_epoch=6, processes=1, epoch_clips="k")
    restart_epoch_if_regrouped(regrouped, "k", lines.append, batch_size=8, saved_batch_size=4)
    assert regrouped.batch_in_epoch == 0 and "starts again from its beginning" in lines[-1]
    assert "--batch_size 8 (the checkpoint's run used 4)" in lines[-1]
    kept = TrainState(epoch=5, batch_in_epoch=6, processes=1, epoch_clips="k")
    restart_epoch_if_regrouped(kept, "k", lines.append, batch_size=4, saved_batch_size=4)
    assert kept.batch_in_epoch == 6 and len(lines) == 1
    for changed in ({"batch_size": 8, "saved_batch_size": 4}, {"batch_size": 4, "saved_batch_size": 4}):
        state, lines = TrainState(epoch=5, batch_in_epoch=6, processes=2, epoch_clips="k"), []
        key = "k" if changed["batch_size"] != changed["saved_batch_size"] else "other clips"
        restart_epoch_if_regrouped(state, key, lines.append, **changed)
        rescale_epoch_position(state, 1, lines.append)
        assert (state.batch_in_epoch, state.processes, len(lines)) == (0, 1, 1), lines
        assert "starts again from its beginning" in lines[0]


def test_a_mid_epoch_resume_on_other_training_clips_starts_the_epoch_again():
    """The epoch's order is drawn from the clips and their lengths: resumed on another set (a clip
    added), the saved position skipped clips of the epoch that the first session never trained."""
    import numpy as np

    from vits_trainer.data.clipstore import ClipStore
    from vits_trainer.data.items import TrainingItems
    from vits_trainer.data.sampler import BucketBatchSampler
    from vits_trainer.training.session import epoch_clips_key, restart_epoch_if_regrouped
    from vits_trainer.training.trainstate import TrainState

    def items(n: int) -> TrainingItems:
        lengths = np.array([100 + (k * 37) % 400 for k in range(n)], dtype=np.int64)
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        store = ClipStore(
            [f"c{k}" for k in range(n)], ["a"] * n, ["0"] * n, offsets, np.zeros(offsets[-1], np.int16), 16000
        )
        return TrainingItems(store, np.arange(n), [np.ones(1, np.int64)] * n, np.zeros(n, np.int64))

    def epoch(train: TrainingItems, start: int = 0) -> list[int]:
        sampler = BucketBatchSampler(train.audio_lengths(), 4, seed=3)
        sampler.set_epoch(2)
        sampler.set_start(start)
        return [train.clip_id(i) for b in sampler for i in b]

    before, after = items(96), items(97)
    state, lines = TrainState(epoch=2, batch_in_epoch=6), []
    restart_epoch_if_regrouped(state, epoch_clips_key(before), lines.append)  # the first session
    done = epoch(before)[: 6 * 4]
    restart_epoch_if_regrouped(state, epoch_clips_key(after), lines.append)  # resumed on 97 clips
    rest = epoch(after, state.batch_in_epoch)
    assert {f"c{k}" for k in range(97)} <= set(done + rest)
    assert state.batch_in_epoch == 0 and "starts again from its beginning" in lines[-1]
    same = TrainState(epoch=2, batch_in_epoch=6, epoch_clips=epoch_clips_key(items(96)))
    restart_epoch_if_regrouped(same, epoch_clips_key(before), lines.append)
    old = TrainState(epoch=2, batch_in_epoch=6)  # a checkpoint from before: as saved
    restart_epoch_if_regrouped(old, epoch_clips_key(after), lines.append)
    assert (same.batch_in_epoch, old.batch_in_epoch, len(lines)) == (6, 6, 1)


def test_a_mid_epoch_resume_with_another_epoch_size_starts_the_epoch_again():
    """A feedback round resumed with another --replay_ratio: the same clips, but each epoch draws another
    number of replayed ones, so the saved position counted batches of a differently made epoch (feedback
    clips trained twice in it, others not at all). The epoch starts again, and says so."""
    import numpy as np

    from vits_trainer.data.clipstore import ClipStore
    from vits_trainer.data.items import TrainingItems
    from vits_trainer.training.session import epoch_clips_key, restart_epoch_if_regrouped
    from vits_trainer.training.trainstate import TrainState

    n = 30
    lengths = np.full(n, 100, dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    store = ClipStore(
        [f"c{k}" for k in range(n)], ["a"] * n, ["0"] * n, offsets, np.zeros(offsets[-1], np.int16), 16000
    )
    train = TrainingItems(store, np.arange(n), [np.ones(1, np.int64)] * n, np.zeros(n, np.int64))
    state, lines = TrainState(epoch=1, batch_in_epoch=3), []
    restart_epoch_if_regrouped(state, epoch_clips_key(train, 20), lines.append)  # 10 fed back + 10 replayed
    restart_epoch_if_regrouped(state, epoch_clips_key(train, 20), lines.append)  # the same round again
    assert state.batch_in_epoch == 3 and not lines
    restart_epoch_if_regrouped(state, epoch_clips_key(train, 15), lines.append)  # --replay_ratio 0.5
    assert state.batch_in_epoch == 0 and "starts again from its beginning" in lines[-1]
    # a run whose epoch is its training clips keeps the key it had before epoch sizes were counted
    assert epoch_clips_key(train) == epoch_clips_key(train, None)


def test_a_run_knows_whether_an_earlier_session_trained_on_other_clips():
    """What the model card needs to say whose data its figures are: sticky once another session's clips
    differed; not known after a checkpoint from before this was kept, unless its key says so."""
    from vits_trainer.training.session import note_earlier_clips
    from vits_trainer.training.trainstate import TrainState

    state = TrainState()
    note_earlier_clips(state, "a", resumed=False)  # the first session
    assert state.other_clips_before is False
    state = TrainState.from_dict({**state.to_dict(), "epoch_clips": "a", "sessions": 1})
    note_earlier_clips(state, "a", resumed=True)
    assert state.other_clips_before is False
    note_earlier_clips(state, "b", resumed=True)  # other clips in this session
    assert state.other_clips_before is True
    state.epoch_clips = "b"
    note_earlier_clips(state, "b", resumed=True)  # the same again later: an earlier session's differed
    assert state.other_clips_before is True
    older = {"epoch_clips": "a", "sessions": 1}  # a checkpoint from before: the first session's
    for saved, key, known in [
        (older, "a", False),
        (older, "b", True),
        ({"epoch_clips": "a", "sessions": 2}, "a", None),  # sessions before it unknown
        ({"epoch_clips": None, "sessions": 1}, "a", None),
    ]:
        state = TrainState.from_dict(saved)
        note_earlier_clips(state, key, resumed=True)
        assert state.other_clips_before is known, (saved, key)


def test_a_resumed_runs_settings_are_checked_again(tmp_path, tone_corpus):
    """A flag given on resume that the run's restored settings cannot go with (refused at a fresh
    start) was accepted: --freerun_samples 0 on a run of --best_metric val_mel_dtw computed no
    val_mel_dtw again, and best_model stopped moving."""
    from vits_trainer.errors import UserError
    from vits_trainer.training.session import check_inputs

    folders = dict(data_dir=str(tone_corpus), output_dir=str(tmp_path / "o"))
    saved = TrainConfig(best_metric="val_mel_dtw", **folders).to_dict()
    cfg = parse(["--freerun_samples", "0", "--checkpoint_dir", str(tmp_path / "c")])
    merged = restore_settings(cfg, saved, [].append, source="step_00000003")
    with pytest.raises(UserError, match="--best_metric val_mel_dtw needs --freerun_samples"):
        check_inputs(merged, resumed=True)
    # and another --best_metric is not used: best_model's score is of the run's own metric
    lines = []
    merged = restore_settings(
        parse(["--best_metric", "val_mel"]), saved, lines.append, source="step_00000003"
    )
    assert merged.best_metric == "val_mel_dtw" and "--best_metric val_mel is not used" in lines[0]
    # a restored --gradient_checkpointing with --compile on is no error there: compiling stays off
    saved = TrainConfig(
        gradient_checkpointing=True, data_dir=str(tone_corpus), output_dir=str(tmp_path / "o")
    )
    merged = restore_settings(parse(["--compile", "on"]), saved.to_dict(), [].append, source="step_00000003")
    check_inputs(merged, resumed=True)


def test_a_micro_batch_size_given_on_resume_is_checked_against_the_runs_batch(tmp_path, tone_corpus):
    """--micro_batch_size 3 on resume of a --batch_size 6 run was refused against the default batch
    (8 x 4 = 32 clips) before the run's own settings were read."""
    from vits_trainer.errors import UserError
    from vits_trainer.training.session import check_inputs

    (tmp_path / "c" / "step_00000001").mkdir(parents=True)
    cfg = parse(["--micro_batch_size", "3", "--checkpoint_dir", str(tmp_path / "c")])
    assert cfg.may_restore()
    cfg.validate(final=not cfg.may_restore())  # the command line alone: no error yet
    saved = TrainConfig(batch_size=6, gradient_accumulation_steps=1, data_dir=str(tone_corpus)).to_dict()
    check_inputs(restore_settings(cfg, saved, [].append, source="step_00000001"), resumed=True)
    with pytest.raises(UserError, match="--micro_batch_size 3 must divide the 32 clips"):  # a fresh run
        parse(["--micro_batch_size", "3", "--resume", "none"]).validate(final=True)


def test_set_up_starts_an_epoch_again_only_when_the_training_clips_changed(
    tmp_path, tiny_model_dir, tone_corpus
):
    """The check is made where a resumed session is built: a checkpoint records what its epoch was ordered
    from, and a resume on the same clips keeps its position while one on other clips starts it again."""
    import shutil
    from pathlib import Path

    from tests.helpers import train_tiny
    from vits_trainer.training.session import build_session, epoch_clips_key

    session, summary = train_tiny(tmp_path, tone_corpus, tiny_model_dir, max_steps=1)
    saved = json.loads((Path(summary["last_checkpoint"]) / "trainer_state.json").read_text())["train_state"]
    assert saved["batch_in_epoch"] > 0 and saved["epoch_clips"] == epoch_clips_key(session.data.train)
    fewer = tmp_path / "fewer"
    shutil.copytree(tone_corpus, fewer, ignore=shutil.ignore_patterns("cache"))
    rows = (fewer / "metadata.csv").read_text(encoding="utf-8").splitlines()
    train_ids = set(session.data.train.ids())
    dropped = next(r for r in rows if r.split("|")[0] in train_ids)
    (fewer / "metadata.csv").write_text("\n".join(r for r in rows if r != dropped) + "\n", encoding="utf-8")
    for name, data, position in (("same", tone_corpus, saved["batch_in_epoch"]), ("fewer", fewer, 0)):
        argv = ["--resume", summary["last_checkpoint"], "--checkpoint_dir", str(tmp_path / f"ckpt_{name}")]
        resumed = build_session(parse([*argv, "--data_dir", str(data), "--target_hours", "1"]), time.time())
        resumed.run_lock.release()
        assert resumed.state.batch_in_epoch == position, name
