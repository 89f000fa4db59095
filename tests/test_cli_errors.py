"""Bad command lines and data: one `error:` line, a non-zero exit, no traceback, nothing written."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import torch

from tests.helpers import PYTHON, ROOT, refuse_reading, train_tiny
from vits_trainer.training.runtime import resolve_precision


def make_cases(tmp: Path, corpus: Path, model: Path) -> dict[str, tuple[list[str], str]]:
    (tmp / "notes.txt").write_text("x", encoding="utf-8")
    empty = tmp / "empty_data"
    empty.mkdir()
    junk = tmp / "junk_data"
    (junk / "wavs").mkdir(parents=True)
    (junk / "metadata.csv").write_text("only-one-field\n\n||\n", encoding="utf-8")
    ok = ["--data_dir", str(corpus), "--model_name", str(model)]
    (tmp / "a_run" / "step_00000003").mkdir(parents=True)  # a run's checkpoint folder, given as --resume
    (tmp / "a_run" / "step_00000003" / "manifest.json").write_text("{}", encoding="utf-8")
    (tmp / "a_run" / "step_00000005").mkdir()  # newer, but never completed: not the one to suggest
    return {
        "zero budget": ([*ok, "--target_hours", "0"], "--target_hours must be positive"),
        "negative budget": ([*ok, "--target_hours", "-2"], "--target_hours must be positive"),
        "batch 0": ([*ok, "--batch_size", "0"], "--batch_size must be positive"),
        "not a number": ([*ok, "--batch_size", "eight"], "invalid int value"),
        "negative weight decay": ([*ok, "--weight_decay", "-1"], "--weight_decay must be 0 or more"),
        # in frames, 32 would be the usual segment: it is samples, and shorter than the mel loss's window
        "segment shorter than a window": ([*ok, "--segment_size", "32"], "--segment_size 32: at least "),
        "missing data_dir": (["--data_dir", str(tmp / "nope"), "--model_name", str(model)], "no such folder"),
        # a file there said "no such folder (run prepare_data.py first)", of a path that exists
        "data_dir is a file": (
            ["--data_dir", str(tmp / "notes.txt"), "--model_name", str(model)],
            "is a file, not a folder: pass the folder prepare_data.py wrote (its --data_dir)",
        ),
        "empty data_dir": (
            ["--data_dir", str(empty), "--model_name", str(model)],
            "metadata.csv: no such file",
        ),
        "no usable rows": (["--data_dir", str(junk), "--model_name", str(model)], "no usable rows"),
        "missing model": (
            ["--data_dir", str(corpus), "--model_name", str(tmp / "no_model")],
            "no such folder",
        ),
        "offline hub id": (
            ["--data_dir", str(corpus), "--model_name", "facebook/mms-tts-xyz"],
            "could not be fetched from the Hugging Face hub",
        ),
        "unknown resume path": ([*ok, "--resume", str(tmp / "no_ckpt")], "no such checkpoint folder"),
        "resume names the run's folder": (
            [*ok, "--resume", str(tmp / "a_run")],
            f"holds checkpoints, it is not one; pass its newest, --resume {tmp / 'a_run' / 'step_00000003'}",
        ),
        # a folder that never was a checkpoint (it read "no manifest (interrupted while saving)")
        "resume names a data folder": (
            [*ok, "--resume", str(corpus)],
            "not a checkpoint (a step_NNNNNNNN folder",
        ),
        # a prefix is no longer taken for the flag it begins (it named another setting than meant)
        "a flag's prefix": (
            [*ok, "--target_hour", "1"],
            "unrecognized flag --target_hour; did you mean --target_hours?",
        ),
    }


def test_every_bad_input_gives_one_clear_line(tmp_path, tone_corpus, tiny_model_dir):
    cases = make_cases(tmp_path, tone_corpus, tiny_model_dir)
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    procs = {}
    for name, (args, _) in cases.items():
        out = tmp_path / name.replace(" ", "_")
        cmd = [
            PYTHON,
            str(ROOT / "train_vits.py"),
            *args,
            "--checkpoint_dir",
            str(out / "ckpt"),
            "--output_dir",
            str(out / "final"),
        ]
        procs[name] = (
            subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env),
            out,
        )
    for name, (proc, out) in procs.items():
        stdout, stderr = proc.communicate(timeout=600)
        expected = cases[name][1]
        lines = [line for line in stderr.splitlines() if line.strip()]
        assert proc.returncode == 2, (name, stdout, stderr)
        assert "Traceback" not in stderr + stdout, name
        assert len(lines) == 1 and lines[0].startswith("error:") and expected in lines[0], (name, lines)
        assert not out.exists(), f"{name}: wrote {list(out.rglob('*'))}"


def test_a_checkpoint_or_output_dir_that_is_a_file_says_so(tmp_path, tone_corpus, tiny_model_dir):
    """They read "cannot be created (File exists)" and "exists and is not a folder of this tool"."""
    blocker = tmp_path / "a_file"
    blocker.write_text("mine", encoding="utf-8")
    ok = ["--data_dir", str(tone_corpus), "--model_name", str(tiny_model_dir), "--cpu"]
    cases = {
        "ckpt": (
            ["--checkpoint_dir", str(blocker), "--output_dir", str(tmp_path / "o1")],
            f"--checkpoint_dir {blocker}: exists and is a file, not a folder: choose another --checkpoint_dir",
        ),
        "ckpt below": (
            ["--checkpoint_dir", str(blocker / "c"), "--output_dir", str(tmp_path / "o2")],
            f"{blocker} is a file, not a folder: choose another --checkpoint_dir",
        ),
        "output": (
            ["--checkpoint_dir", str(tmp_path / "c3"), "--output_dir", str(blocker)],
            f"--output_dir {blocker}: exists and is a file, not a folder (it is left as it is): choose "
            "another --output_dir",
        ),
    }
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    procs = {
        name: subprocess.Popen(
            [PYTHON, str(ROOT / "train_vits.py"), *ok, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for name, (args, _) in cases.items()
    }
    for name, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=600)
        lines = [line for line in stderr.splitlines() if line.strip()]
        assert proc.returncode == 2 and "Traceback" not in stderr + stdout, (name, stderr)
        assert len(lines) == 1 and cases[name][1] in lines[0], (name, lines)
    assert blocker.read_text(encoding="utf-8") == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file"]


def test_resume_none_refuses_to_mix_with_an_earlier_run(tmp_path, tone_corpus, tiny_model_dir):
    ckpt = tmp_path / "ckpt" / "step_00000005"
    ckpt.mkdir(parents=True)
    proc = subprocess.run(
        [
            PYTHON,
            str(ROOT / "train_vits.py"),
            "--data_dir",
            str(tone_corpus),
            "--model_name",
            str(tiny_model_dir),
            "--checkpoint_dir",
            str(tmp_path / "ckpt"),
            "--output_dir",
            str(tmp_path / "final"),
            "--resume",
            "none",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 2 and "--resume auto" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "final").exists()


@pytest.mark.parametrize("flag", ["fp16", "bf16"])
def test_half_precision_without_a_gpu_falls_back_with_a_warning(flag):
    lines = []
    got = resolve_precision(flag, cpu=True, log=lines.append)
    if flag == "fp16":  # fp16 autocast needs CUDA: fp32 instead, said once
        assert got == "no" and lines and "needs a CUDA GPU" in lines[0]
    else:  # CPU autocast supports bf16
        assert got == "bf16" and not lines


def test_mas_backend_triton_where_triton_cannot_run_falls_back_with_a_warning(monkeypatch):
    """A CPU, or a GPU older than Triton supports (mocked here: this machine has no GPU): the backend
    `auto` picks there, which finds the same path, and one warning (it was a traceback at the first
    alignment search)."""
    from vits_trainer.model import triton_support
    from vits_trainer.training.runtime import resolve_mas_backend

    lines = []
    assert resolve_mas_backend("triton", torch.device("cpu"), lines.append) == "numba"
    assert lines == [
        "warning: --mas_backend triton needs a CUDA GPU that Triton supports (this run trains on the CPU); "
        "using numba"
    ]
    old_gpu = "the Tesla P100-PCIE-16GB (compute capability 6.0) is older than Triton ..."
    monkeypatch.setattr(triton_support, "triton_problem", lambda device=None: old_gpu)
    lines.clear()
    assert resolve_mas_backend("triton", torch.device("cuda", 0), lines.append) == "torch"
    assert len(lines) == 1 and f"({old_gpu}); using torch" in lines[0]
    monkeypatch.setattr(triton_support, "triton_problem", lambda device=None: None)
    lines.clear()
    assert resolve_mas_backend("triton", torch.device("cuda", 0), lines.append) == "triton" and not lines
    for other in ("auto", "numba", "torch"):  # each runs anywhere (auto picks for the device)
        assert resolve_mas_backend(other, torch.device("cpu"), lines.append) == other and not lines


def test_a_run_asked_for_the_triton_alignment_search_on_a_cpu_trains(
    tmp_path, tone_corpus, tiny_model_dir, capsys
):
    session, summary = train_tiny(tmp_path, tone_corpus, tiny_model_dir, max_steps=1, mas_backend="triton")
    assert summary["steps"] == 1 and session.generator_raw.mas_backend == "numba"
    assert "warning: --mas_backend triton needs a CUDA GPU" in capsys.readouterr().out


def test_a_misspelt_flag_is_named_with_the_one_meant_before_a_missing_one(capsys):
    """In-process (argument parsing only): the misspelt flag comes first, with its likely meaning, not
    argparse's 'the following arguments are required' for the flag it was meant to be."""
    import prepare_data
    import train_feedback
    import train_vits
    from vits_trainer import speak
    from vits_trainer.errors import run_cli

    cases = [
        (prepare_data.main, ["--sorce", "corpus"], "unrecognized flag --sorce; did you mean --source?"),
        (
            train_vits.main,
            ["--model-name", "m", "--data-dir", "d"],
            "unrecognized flag --model-name; did you mean --model_name?",
        ),
        (
            train_vits.main,
            ["--resume=auto", "--lerning_rate", "1"],
            "unrecognized flag --lerning_rate; did you mean --learning_rate?",
        ),
        (speak.main, ["--modle", "x"], "unrecognized flag --modle; did you mean --model?"),
        # a flag cut short is meant as the one it begins (--base for --base_model, which was --seed)
        (train_feedback.main, ["--base", "m"], "unrecognized flag --base; did you mean --base_model?"),
        (
            train_vits.main,
            ["--grad", "1"],
            "did you mean --gradient_accumulation_steps or --gradient_checkpointing?",
        ),
        (train_vits.main, ["--zzzz"], "unrecognized flag --zzzz (see --help)"),
        # `--push_to_hub "$REPO"` with REPO unset trained the whole budget and pushed nothing, silently
        (train_vits.main, ["--push_to_hub", ""], "argument --push_to_hub: needs a repo id, USER/NAME"),
        (train_vits.main, ["--push_to_hub= "], "argument --push_to_hub: needs a repo id, USER/NAME"),
        # `--resume "$CKPT"` with CKPT unset named the folder the command runs in
        (train_vits.main, ["--resume", ""], "argument --resume: needs auto, none or a checkpoint folder"),
        (train_feedback.main, ["--resume", ""], "argument --resume: needs auto, none or a checkpoint folder"),
    ]
    for main, argv, expected in cases:
        assert run_cli(main, argv) == 2
        assert expected in capsys.readouterr().err, argv


def test_a_runs_error_line_and_crash_traceback_go_into_its_log_too(tmp_path, monkeypatch):
    """Once a run keeps train.log, the CLI's own `error:` line and a crash's traceback go there as well
    (a lost notebook output keeps them). A reader leaving the pipe is still exit 141, no traceback
    (tests/test_prepare_cli.py)."""
    from vits_trainer.errors import UserError, run_cli
    from vits_trainer.training.runtime import Logger

    log = tmp_path / "train.log"
    monkeypatch.setattr(Logger, "copy", type(Logger.copy)())

    def fails_with(err):
        def main(argv):
            Logger()("set-up done")
            Logger.copy.to(log)  # as build_session does once set-up found no bad input
            raise err

        return main

    assert run_cli(fails_with(UserError("the disk is full"))) == 2
    assert log.read_text(encoding="utf-8").splitlines()[1:] == ["set-up done", "error: the disk is full"]
    with pytest.raises(RuntimeError):
        run_cli(fails_with(RuntimeError("a bug")))
    text = log.read_text(encoding="utf-8")
    assert "Traceback (most recent call last)" in text and text.rstrip().endswith("RuntimeError: a bug")


def test_several_processes_say_a_set_up_error_once(monkeypatch, capsys):
    """Under `accelerate launch` every process checks the same input: a missing --data_dir printed its
    `error:` line once per process. The others exit 2 silently; an error one of them meets once the
    processes are connected (its own GPU's memory) is its own, and says which process."""
    import torch.distributed as dist

    from vits_trainer import errors
    from vits_trainer.errors import UserError, run_cli

    def fails(argv):
        raise UserError("--data_dir x: no such folder")

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    assert run_cli(fails) == 2
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(errors, "_process_group_started", lambda: True)
    monkeypatch.setattr(dist, "destroy_process_group", lambda: None)
    assert run_cli(fails) == 2
    assert capsys.readouterr().err == "error (process 1): --data_dir x: no such folder\n"
    monkeypatch.setenv("RANK", "0")
    assert run_cli(fails) == 2
    assert capsys.readouterr().err == "error: --data_dir x: no such folder\n"


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("max_grad_norm", -5.0, "--max_grad_norm must be positive"),  # flipped the gradient's sign
        ("max_grad_norm", 0.0, "--max_grad_norm must be positive"),  # trained nothing
        ("max_grad_norm", float("nan"), "--max_grad_norm must be positive"),
        ("mel_weight", -45.0, "--mel_weight must be 0 or more"),
        ("kl_weight", float("nan"), "--kl_weight must be 0 or more"),
        ("weight_decay", float("nan"), "--weight_decay must be a number"),  # a traceback in AdamW
        ("max_ram_gb", float("inf"), "--max_ram_gb must be a number"),
        ("total_hours", float("inf"), "--total_hours must be positive"),  # a traceback at step 2
        ("seed", -1, r"--seed must be in \[0, 2\*\*32\)"),  # a traceback after the start evaluation
        ("seed", 2**64, r"--seed must be in"),
        ("discriminator_width", 1e9, r"--discriminator_width 1e\+09: at most 4"),  # a 960 GB allocation
    ],
)
def test_values_that_failed_later_or_trained_wrongly_are_refused_up_front(field, value, message):
    import dataclasses

    from vits_trainer.errors import UserError
    from vits_trainer.training.config import TrainConfig

    with pytest.raises(UserError, match=message):
        dataclasses.replace(TrainConfig(), **{field: value}).validate()
    TrainConfig().validate()  # the defaults pass


def test_all_loss_weights_zero_is_refused():
    import dataclasses

    from vits_trainer.errors import UserError
    from vits_trainer.training.config import LOSS_WEIGHT_FLAGS, TrainConfig

    zero = dataclasses.replace(TrainConfig(), **dict.fromkeys(LOSS_WEIGHT_FLAGS, 0.0))
    with pytest.raises(UserError, match="every loss weight is 0"):  # it trained nothing, 'loss 0.000'
        zero.validate()
    dataclasses.replace(zero, mel_weight=1.0).validate()  # one term is a choice


def test_a_huge_step_is_refused_or_planned_at_once():
    """--batch_size 100000 --gradient_accumulation_steps 100000: the divisors were found by a linear scan
    (no output for minutes), and the error listed a thousand characters of them."""
    import dataclasses
    import time

    from vits_trainer.errors import UserError
    from vits_trainer.training.config import TrainConfig, divisors
    from vits_trainer.training.microbatch_choice import candidates

    assert divisors(12) == [1, 2, 3, 4, 6, 12] and divisors(49) == [1, 7, 49] and divisors(1) == [1]
    huge = dataclasses.replace(TrainConfig(), batch_size=100_000, gradient_accumulation_steps=100_000)
    start = time.process_time()
    with pytest.raises(
        UserError, match="one of 1, 2, 4, 5, 8, 10, 16, 20, 25, 32, 40, 50 ... 10000000000, or auto"
    ):
        dataclasses.replace(huge, micro_batch_size="7").validate()
    assert candidates(huge)[0] == 100_000 and candidates(huge)[-1] == 10**10
    assert time.process_time() - start < 5  # CPU time: seconds where it was minutes, however loaded


@pytest.mark.parametrize("rank", ["abc", ""])
def test_a_stray_rank_in_the_environment_still_gives_one_error_line(tmp_path, rank):
    # RANK set to something no launcher sets (even empty) turned the error line into a ValueError
    # traceback: the error handler itself read it as a number
    env = dict(os.environ, HF_HUB_OFFLINE="1", RANK=rank)
    proc = subprocess.run(
        [PYTHON, str(ROOT / "train_vits.py"), "--data_dir", str(tmp_path / "nope")],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr + proc.stdout, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert (
        lines[0] == f"warning: RANK={rank!r} is not a process number: this process counts as the main one (0)"
    )
    assert len(lines) == 2 and lines[1].startswith("error: --data_dir") and "no such folder" in lines[1]


def test_a_stray_world_size_is_one_error_line_before_accelerate_reads_it(
    tmp_path, tone_corpus, tiny_model_dir
):
    # accelerate reads WORLD_SIZE as a number on a CPU run: WORLD_SIZE=abc ended it with a traceback
    env = dict(os.environ, HF_HUB_OFFLINE="1", WORLD_SIZE="abc")
    args = ["--data_dir", str(tone_corpus), "--model_name", str(tiny_model_dir), "--cpu"]
    args += ["--checkpoint_dir", str(tmp_path / "ckpt"), "--output_dir", str(tmp_path / "final")]
    proc = subprocess.run(
        [PYTHON, str(ROOT / "train_vits.py"), *args], capture_output=True, text=True, env=env, timeout=300
    )
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and "Traceback" not in proc.stderr + proc.stdout, proc.stderr[-3000:]
    assert lines == [
        "error: WORLD_SIZE='abc' is not a number of processes (torchrun and accelerate launch set it "
        "themselves): unset it to train in one process"
    ]
    assert not (tmp_path / "ckpt").exists() and not (tmp_path / "final").exists()


@pytest.mark.parametrize(
    ("script", "args", "expected"),
    [
        ("prepare_data.py", ["--source", "no/corpus", "--data_dir", "out"], "no such file or folder"),
        ("speak.py", ["--model", "no/model", "--text", "hi", "--out", "hi.wav"], "--model no/model"),
        # the discriminator converter (python -m vits_trainer.model.discriminator) is no launch's either
        ("vits_trainer.model.discriminator", ["convert", "no/D.pth", "out"], "no/D.pth: no such file"),
    ],
)
def test_a_one_process_tool_says_its_error_whatever_rank_the_environment_gives(
    tmp_path, script, args, expected
):
    # RANK=1 WORLD_SIZE=2 left over from a launch (a notebook's environment): prepare_data.py and
    # speak.py, never one of a launch's processes, took themselves for its second one and exited 2
    # without a word
    env = dict(os.environ, HF_HUB_OFFLINE="1", RANK="1", WORLD_SIZE="2", LOCAL_WORLD_SIZE="2")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    command = [str(ROOT / script)] if script.endswith(".py") else ["-m", script]
    proc = subprocess.run(
        [PYTHON, *command, *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0].startswith("error:") and expected in lines[0], lines


def test_a_one_process_tool_says_interrupted_whatever_rank_the_environment_gives(monkeypatch, capsys):
    # Ctrl-C in prepare_data.py or speak.py with RANK=1 left over from a launch: taken for a launch's
    # second process, it exited 130 without a word
    from vits_trainer.errors import run_cli

    def stopped(argv):
        raise KeyboardInterrupt

    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert run_cli(stopped, [], one_process=True) == 130
    assert capsys.readouterr().err.strip() == "interrupted"
    assert run_cli(stopped, []) == 130  # a trainer's second process: its main one says it
    assert capsys.readouterr().err.strip() == ""


def test_a_metadata_csv_that_cannot_be_read_is_one_error_line(tmp_path, monkeypatch, capsys, tiny_model_dir):
    # permission denied on the data folder's metadata.csv was a traceback; a folder in its place was
    # "no such file (run prepare_data.py first)"
    import train_vits
    from vits_trainer.data.synthetic import make_corpus
    from vits_trainer.errors import run_cli

    data = tmp_path / "data"
    make_corpus(data, num_clips=2)
    meta = data / "metadata.csv"
    refuse_reading(monkeypatch, meta)
    argv = ["--data_dir", str(data), "--model_name", str(tiny_model_dir), "--output_dir", str(tmp_path / "o")]
    argv += ["--checkpoint_dir", str(tmp_path / "c"), "--cpu"]
    assert run_cli(train_vits.main, argv) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith(f"error: {meta}: cannot be read (Permission denied)"), err
    monkeypatch.undo()
    meta.unlink()
    meta.mkdir()
    assert run_cli(train_vits.main, argv) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and err.startswith(f"error: {meta}: is a folder"), err
    assert not (tmp_path / "o").exists() and not (tmp_path / "c").exists()
