"""Damaged or mistaken inputs that used to end in a traceback: a truncated model.safetensors, a
checkpoint folder passed as a model folder, a checkpoint with a flipped byte. Each is one `error:` line
and exit 2 from the real CLIs; a damaged checkpoint met mid-run by a recovery is a warning, not a crash.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import torch

from tests.helpers import (
    PYTHON,
    ROOT,
    SIGNALS_SENT,
    TINY_SETTINGS,
    cli_args,
    make_kl_infinite,
    sigterm_at_batch,
    tiny_config,
    train_tiny,
)
from vits_trainer.data.synthetic import make_corpus
from vits_trainer.training.checkpoint import list_checkpoints
from vits_trainer.training.loop import Trainer
from vits_trainer.training.session import build_session


@pytest.fixture(scope="module")
def short_run(tmp_path_factory, tiny_model_dir, tone_corpus):
    """A real 2-step run: its checkpoint folders are what users mistake for model folders."""
    tmp = tmp_path_factory.mktemp("short_run")
    train_tiny(tmp, tone_corpus, tiny_model_dir, max_steps=2, save_minutes=0.001)
    return tmp / "checkpoints"


def flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size: only a checksum can tell
    path.write_bytes(bytes(data))


def truncated_model(tmp: Path, model: Path) -> Path:
    broken = tmp / "broken_model"
    shutil.copytree(model, broken)
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    return broken


def one_error_line(proc: subprocess.CompletedProcess, *expected: str) -> str:
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2, (proc.stdout[-2000:], proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr + proc.stdout
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    for text in expected:
        assert text in lines[0], lines[0]
    return lines[0]


def train_vits(tmp: Path, data: Path, model: Path | str, fresh_process=False, **extra):
    settings = dict(
        TINY_SETTINGS, data_dir=data, model_name=model, checkpoint_dir=tmp / "ckpt", output_dir=tmp / "final"
    )
    settings.update(extra)
    return command("train_vits", cli_args(settings), fresh_process)


def train_feedback(tmp: Path, data: Path, base: Path, fresh_process=False):
    feedback = tmp / "feedback"
    make_corpus(feedback, num_clips=3, seed=5, id_prefix="fb")
    settings = dict(
        TINY_SETTINGS, base_model=base, feedback_dir=feedback, data_dir=data, output_dir=tmp / "fb"
    )
    settings.pop("val_fraction")
    return command("train_feedback", cli_args(settings), fresh_process)


def command(script: str, argv: list[str], fresh_process: bool) -> subprocess.CompletedProcess:
    """`script`.py run with `argv`: in a fresh interpreter, or in this process through the same run_cli its
    `__main__` calls (a fresh one spends ~10 s loading torch before the error it is run for)."""
    if fresh_process:
        cmd = [PYTHON, str(ROOT / f"{script}.py"), *argv]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    import importlib

    from vits_trainer.errors import run_cli

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = run_cli(importlib.import_module(script).main, argv)
    return subprocess.CompletedProcess(argv, code, out.getvalue(), err.getvalue())


def test_truncated_model_file_is_one_error_line(tmp_path, tiny_model_dir, tone_corpus):
    broken = truncated_model(tmp_path, tiny_model_dir)
    # both CLIs as a user runs them, in a fresh interpreter (the other tests here call them in-process)
    proc = train_vits(tmp_path, tone_corpus, broken, fresh_process=True)
    one_error_line(proc, "--model_name", "model.safetensors is damaged")
    assert not (tmp_path / "ckpt").exists() and not (tmp_path / "final").exists()
    proc = train_feedback(tmp_path, tone_corpus, broken, fresh_process=True)
    one_error_line(proc, "--base_model", "model.safetensors is damaged")
    assert not (tmp_path / "fb").exists()


def test_another_models_folder_or_a_broken_config_is_one_error_line(tmp_path, tiny_model_dir, tone_corpus):
    """A folder of another architecture, a config.json that is not JSON, a model without its tokenizer:
    each one line naming the flag (train_feedback.py failed inside transformers' tokenizer)."""
    from vits_trainer.errors import UserError
    from vits_trainer.training.modelfolder import check_model_folder

    def variant(name: str, change) -> Path:
        folder = tmp_path / name
        shutil.copytree(tiny_model_dir, folder)
        change(folder)
        return folder

    bert = variant("bert", lambda f: (f / "config.json").write_text('{"model_type": "bert"}'))
    broken = variant("broken", lambda f: (f / "config.json").write_text("not json"))
    no_vocab = variant("no_vocab", lambda f: (f / "vocab.json").unlink())
    for folder, expected in (
        (bert, "not a VITS model (its config.json says model_type 'bert')"),
        (broken, "its config.json cannot be read (Expecting value"),
        (no_vocab, "no vocab.json"),
    ):
        with pytest.raises(UserError, match=re.escape(expected)):
            check_model_folder(folder, "--base_model")
    check_model_folder(tiny_model_dir, "--base_model")  # a real one passes
    one_error_line(train_feedback(tmp_path, tone_corpus, bert), "--base_model", "not a VITS model")
    assert not (tmp_path / "fb").exists()


@pytest.mark.parametrize("vocab", ['["a", "b"]', "3", '{"a": "one"}', '{"a":'], ids=str)
def test_a_vocab_json_that_is_no_mapping_of_characters_to_ids_is_one_error_line(
    tmp_path, tiny_model_dir, tone_corpus, vocab
):
    # a vocab.json holding a JSON list ended train_vits.py in a traceback from inside transformers'
    # tokenizer (AttributeError: 'list' object has no attribute 'items')
    from vits_trainer.errors import UserError
    from vits_trainer.training.modelfolder import check_model_folder

    folder = tmp_path / "model"
    shutil.copytree(tiny_model_dir, folder)
    (folder / "vocab.json").write_text(vocab, encoding="utf-8")
    with pytest.raises(UserError, match=re.escape(f"--model_name {folder}: its vocab.json")):
        check_model_folder(folder, "--model_name")
    if vocab.startswith("["):  # and through the real command line
        one_error_line(train_vits(tmp_path, tone_corpus, folder), "--model_name", "vocab.json")
        assert not (tmp_path / "ckpt").exists()


@pytest.mark.parametrize(("config", "kind"), [("[]", "list"), ("3", "number"), ('"vits"', "string")], ids=str)
def test_a_config_json_that_is_no_json_object_is_named_as_such(tmp_path, tiny_model_dir, config, kind):
    # a config.json holding a JSON list was reported as "not a VITS model (... model_type None)"
    from vits_trainer.errors import UserError
    from vits_trainer.training.modelfolder import check_model_folder

    folder = tmp_path / "model"
    shutil.copytree(tiny_model_dir, folder)
    (folder / "config.json").write_text(config, encoding="utf-8")
    expected = f"--model_name {folder}: its config.json holds a JSON {kind}, not a JSON object"
    with pytest.raises(UserError, match=re.escape(expected)):
        check_model_folder(folder, "--model_name")
    if kind == "list":  # and through the real command line
        cmd = [PYTHON, str(ROOT / "speak.py"), "--model", str(folder), "--text", "abc", "--out"]
        proc = subprocess.run([*cmd, str(tmp_path / "a.wav")], capture_output=True, text=True, timeout=120)
        line = one_error_line(proc, f"--model {folder}: its config.json holds a JSON list, not a JSON object")
        assert "model_type" not in line and not (tmp_path / "a.wav").exists()


@pytest.mark.parametrize("tokenizer_config", ["[]", "3", "{"], ids=str)
def test_a_tokenizer_config_that_is_no_json_object_is_one_error_line(
    tmp_path, tiny_model_dir, tokenizer_config
):
    # a tokenizer_config.json holding a JSON list passed the folder check and failed inside transformers'
    # tokenizer with "TypeError: pop expected at most 1 argument, got 2"
    from vits_trainer.errors import UserError
    from vits_trainer.training.modelfolder import check_model_folder

    folder = tmp_path / "model"
    shutil.copytree(tiny_model_dir, folder)
    (folder / "tokenizer_config.json").write_text(tokenizer_config, encoding="utf-8")
    with pytest.raises(UserError, match=re.escape(f"--model_name {folder}: its tokenizer_config.json")):
        check_model_folder(folder, "--model_name")


def test_checkpoint_folder_is_not_a_model_folder(tmp_path, short_run, tone_corpus):
    step = list_checkpoints(short_run)[0]
    line = one_error_line(
        train_vits(tmp_path, tone_corpus, step), "is a training checkpoint, not a model folder", "best_model"
    )
    assert f"--resume {step}" in line  # what continuing that run takes
    assert not (tmp_path / "ckpt").exists()
    one_error_line(train_feedback(tmp_path, tone_corpus, step), "--base_model", "is a training checkpoint")
    assert not (tmp_path / "fb").exists()


def test_resume_path_with_a_flipped_byte_is_one_error_line(tmp_path, short_run, tiny_model_dir, tone_corpus):
    run = tmp_path / "run"
    shutil.copytree(short_run, run)
    step = list_checkpoints(run)[0]
    flip_byte(step / "generator.safetensors")
    proc = train_vits(tmp_path, tone_corpus, tiny_model_dir, resume=step, checkpoint_dir=run, max_steps=4)
    one_error_line(proc, step.name, "--resume")
    assert not (tmp_path / "final").exists()
    assert list_checkpoints(run)[0] == step  # nothing newer was written over the damaged run


def test_recovery_from_a_damaged_checkpoint_falls_back_to_the_starting_weights(
    tmp_path, tiny_model_dir, tone_corpus, monkeypatch, capsys
):
    cfg = tiny_config(tmp_path, tone_corpus, tiny_model_dir, max_steps=1)
    torch.manual_seed(0)
    session = build_session(cfg, time.time())
    trainer = Trainer(session)
    step = trainer.outputs.save_checkpoint("test")
    flip_byte(step / "generator.safetensors")
    session.state.last_finite_step = 1  # a finite step came after it: one a recovery would reload
    with torch.no_grad():  # weights that moved since the start: the fallback must put them back
        for p in session.model.parameters():
            p.add_(1.0)
    trainer.recovery.recover()
    out = capsys.readouterr().out
    assert f"recovery cannot reload {step}" in out and "reloaded the starting weights" in out
    start = trainer.recovery.initial_weights[0]
    assert all(torch.equal(v.cpu(), start[k]) for k, v in session.model.state_dict().items())
    assert session.state.recoveries == 1


def test_a_damaged_checkpoint_mid_run_does_not_end_the_run(
    tmp_path, tiny_model_dir, tone_corpus, monkeypatch, capsys
):
    """Inf KL from the 4th training forward on: recovery after 3 skips, with every checkpoint it may
    reload (saved every step before a finite one) damaged just before it is needed."""
    from vits_trainer.training.recovery import Recovery

    real_recover = Recovery.recover

    def damage_then_recover(self):
        assert self.candidates()
        for path in self.candidates():
            flip_byte(path / "generator.safetensors")
        return real_recover(self)

    monkeypatch.setattr(Recovery, "recover", damage_then_recover)
    make_kl_infinite(monkeypatch, 4, 6)
    _, summary = train_tiny(
        tmp_path, tone_corpus, tiny_model_dir, max_steps=8, save_minutes=0.001, max_consecutive_skips=3
    )
    out = capsys.readouterr().out
    assert "recovery cannot reload" in out and summary["steps"] == 8 and summary["final_model"]


def test_signal_before_any_improvement_names_no_best_model(
    tmp_path, tiny_model_dir, tone_corpus, monkeypatch
):
    """A real SIGTERM to this process at the 2nd batch: the run saves and exports, but no evaluation of
    trained weights ever ran, so there is no best_model and nothing may name one."""
    import json

    from train_vits import best_model_words

    sigterm_at_batch(monkeypatch, 2)
    _, summary = train_tiny(tmp_path, tone_corpus, tiny_model_dir, max_steps=50)
    assert summary["stopped_reason"] == "signal" and summary["final_model"]
    assert summary["best_step"] == 0  # the start evaluation measured the model the run started from
    assert summary["best_model"] is None and summary["best_model_step"] is None
    assert not (tmp_path / "checkpoints" / "best_model").exists()
    assert summary["final_val"] is None and summary["final_eval_skipped"] == "stopped by a signal"
    written = json.loads((tmp_path / "checkpoints" / "train_summary.json").read_text())
    assert written["best_model"] is None
    words = best_model_words(summary)
    assert summary["last_eval_step"] == 0  # and it names no evaluation that did not happen
    assert words == "no best model (no evaluation since step 0: stopped by a signal)"


def test_a_signal_during_the_start_evaluation_saves_step_0(
    tmp_path, tiny_model_dir, tone_corpus, monkeypatch
):
    """docs/training.md said a signal during the start evaluation stopped the set-up ("interrupted", exit
    130, nothing saved); the loop's handler holds already: the evaluation ends, step 0 is saved and the
    starting weights exported, which fixes the run's settings for a run in the same folder."""
    import os
    import signal

    from vits_trainer.training.outputs import RunOutputs

    real_eval = RunOutputs.run_eval

    def signal_during_start(self, tag, *args, **kwargs):
        if tag == "start":
            SIGNALS_SENT.append(signal.SIGTERM)
            os.kill(os.getpid(), signal.SIGTERM)
        return real_eval(self, tag, *args, **kwargs)

    monkeypatch.setattr(RunOutputs, "run_eval", signal_during_start)
    _, summary = train_tiny(tmp_path, tone_corpus, tiny_model_dir, max_steps=5)
    assert summary["stopped_reason"] == "signal" and summary["steps"] == 0 and summary["final_model"]
    assert [p.name for p in list_checkpoints(tmp_path / "checkpoints")] == ["step_00000000"]
    docs = " ".join((ROOT / "docs" / "training.md").read_text(encoding="utf-8").split())
    assert "during the start evaluation lets it finish, then saves a checkpoint of step 0" in docs


def test_a_signal_no_test_sent_stops_pytest_instead_of_failing_a_test(
    tmp_path, tiny_model_dir, tone_corpus, monkeypatch
):
    """A SIGTERM from outside (a `timeout` around pytest on a loaded machine) reaches the in-process run's
    handler, which ends the run after its step: the test then failed on its step count ("resumed run
    ended at step 4, expected 12"), a failure that was no result. train_tiny stops pytest instead."""
    import os
    import signal

    import vits_trainer.training.loop as loop_module

    real_move = loop_module.move_batch

    def signal_from_outside(batch, device):
        os.kill(os.getpid(), signal.SIGTERM)  # not through sigterm_at_batch: no test sent it
        monkeypatch.setattr(loop_module, "move_batch", real_move)
        return real_move(batch, device)

    monkeypatch.setattr(loop_module, "move_batch", signal_from_outside)
    with pytest.raises(pytest.exit.Exception, match="a signal no test sent"):
        train_tiny(tmp_path, tone_corpus, tiny_model_dir, max_steps=3, val_fraction=0.0)


def test_a_signal_while_the_run_ends_lets_the_save_and_export_finish(
    tmp_path, tiny_model_dir, tone_corpus, monkeypatch, capsys
):
    """A real SIGINT to this process while the final model is exported (a first Ctrl-C after the budget
    stopped the run, or a second one while a stopped run saves): the trainer's handler still holds it,
    so the export finishes and the line says so. Once, the handlers were put back before the run's end:
    Python's default raised KeyboardInterrupt half way through it, leaving no export and no end record."""
    import os
    import signal

    from vits_trainer.training.outputs import RunOutputs

    reached_default = []

    def stand_in_for_the_default(*args):
        reached_default.append(args)

    previous = signal.signal(signal.SIGINT, stand_in_for_the_default)
    real_export = RunOutputs.export

    def signal_during_final_export(self, folder):
        if folder == self.s.output_dir:
            SIGNALS_SENT.append(signal.SIGINT)
            os.kill(os.getpid(), signal.SIGINT)
        return real_export(self, folder)

    monkeypatch.setattr(RunOutputs, "export", signal_during_final_export)
    try:
        _, summary = train_tiny(tmp_path, tone_corpus, tiny_model_dir, max_steps=2)
        restored = signal.getsignal(signal.SIGINT)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert not reached_default  # the trainer's handler had it ...
    out = capsys.readouterr().out
    assert "SIGINT received: the run is ending: saving and exporting (send it again to exit at once)" in out
    assert summary["final_model"] and (tmp_path / "final_model" / "model.safetensors").is_file()  # ... and
    assert summary["stopped_reason"] == "max_steps"  # the run ended as it was ending
    assert restored is stand_in_for_the_default  # the handler from before the run, again


def test_best_model_is_named_when_it_was_exported(tmp_path, tiny_model_dir, tone_corpus):
    from train_vits import best_model_words
    from vits_trainer.safety import read_marker

    _, summary = train_tiny(tmp_path, tone_corpus, tiny_model_dir, max_steps=6, learning_rate=1e-3)
    best = tmp_path / "checkpoints" / "best_model"
    if summary["best_step"] == 0:  # training never beat the start: then nothing may be named
        assert summary["best_model"] is None and not best.exists()
    else:
        assert summary["best_model"] == str(best) and (best / "model.safetensors").is_file()
        assert summary["best_model_step"] == summary["best_step"] == 6  # the final evaluation's copy
        assert str(best) in best_model_words(summary)
        # the final checkpoint, saved before that copy, names it too: a session resumed from it does
        state = json.loads((tmp_path / "checkpoints" / "step_00000006" / "trainer_state.json").read_text())
        assert state["train_state"]["best_model_step"] == 6
        # and the folder itself says which weights it holds, as the final export it was copied from does
        assert read_marker(best)["step"] == read_marker(Path(summary["final_model"]))["step"] == 6


def test_three_clips_train_on_two_and_a_run_of_no_step_exports_no_best_model(
    tmp_path, tiny_model_dir, monkeypatch, capsys
):
    """A corpus smaller than one step: most clips train, the step estimate is that of the clips there
    are, and no micro-batch trial runs (no step would be full, so none would be measured). Then a run
    whose budget fits no step: its final weights are the start's, scored once and never a best_model."""
    from vits_trainer.training.budget import Budget

    data = tmp_path / "three"
    make_corpus(data, num_clips=3, sample_rate=16000, seed=0)
    run = dict(max_steps=2, val_fraction=0.02, gradient_accumulation_steps=2)  # a trial of 8 or 16 clips
    _, summary = train_tiny(tmp_path / "a", data, tiny_model_dir, **run)
    out = capsys.readouterr().out
    assert "data: 2 training clips" in out and ", 1 val;" in out
    assert "micro-batch trial skipped (only 2 training clips per epoch, fewer than a step's 16)" in out
    assert summary["steps"] == 2 and summary["micro_batch_trial"] is None

    monkeypatch.setattr(Budget, "should_stop", lambda self: True)  # no step fits
    _, summary = train_tiny(tmp_path / "b", data, tiny_model_dir, **run)
    out = capsys.readouterr().out
    assert summary["steps"] == 0 and summary["best_step"] == 0
    from train_vits import best_model_words

    assert best_model_words(summary) == (
        "no best model (no training step fitted in the budget: the final model holds the weights the run "
        "started from)"
    )
    assert summary["best_model"] is None and not (tmp_path / "b" / "checkpoints" / "best_model").exists()
    assert "final evaluation skipped: no training step since the start evaluation" in out
    assert out.count("eval (") == 1 and summary["final_val"] is not None  # the start's, not run twice
    page = (tmp_path / "b" / "checkpoints" / "report.html").read_text(encoding="utf-8")
    assert "the start evaluation's (no training step since)</td>" in page  # as the final one, never "ran"


def test_an_epoch_evaluation_of_the_final_weights_stands_for_the_final_one(
    tmp_path, tiny_model_dir, monkeypatch, capsys
):
    """The budget ends the run right after an epoch's evaluation: those are the final weights, scored
    already, so the final evaluation does not run them again and the export's card names it final."""
    from vits_trainer.training.budget import Budget
    from vits_trainer.training.outputs import RunOutputs

    data = tmp_path / "three"
    make_corpus(data, num_clips=3, sample_rate=16000, seed=0)
    evaluated = []

    def evaluate_every_epoch(self):
        self.run_eval(f"epoch {self.s.state.epoch}")
        evaluated.append(self.s.state.epoch)

    monkeypatch.setattr(RunOutputs, "evaluate_and_save_if_due", evaluate_every_epoch)
    monkeypatch.setattr(Budget, "should_stop", lambda self: bool(evaluated))  # after the first epoch
    _, summary = train_tiny(tmp_path / "run", data, tiny_model_dir, max_steps=5, val_fraction=0.02)
    out = capsys.readouterr().out
    assert summary["steps"] == 1 and evaluated == [1]
    assert "final evaluation skipped: no training step since the epoch 1 evaluation" in out
    assert out.count("eval (") == 2 and summary["final_val"] is not None  # start, epoch 1
    assert summary["final_eval_tag"] == "epoch 1" and summary["final_eval_skipped"] is None
    card = (Path(summary["final_model"]) / "README.md").read_text(encoding="utf-8")
    assert "final | 1 |" in card.split("## Evaluation")[1]
    page = (tmp_path / "run" / "checkpoints" / "report.html").read_text(encoding="utf-8")
    assert "the epoch 1 evaluation's (no training step since)</td>" in page


def test_a_best_model_a_users_file_kept_out_is_named_as_not_exported(
    tmp_path, tiny_model_dir, capsys, monkeypatch
):
    """A file of the user's put into best_model/ while the run starts (one there before is refused up
    front: test_safety.py) is kept; the done line says the best weights were not exported and why,
    never that no evaluation beat the start."""
    from train_vits import best_model_words
    from vits_trainer.training.outputs import RunOutputs

    data = tmp_path / "three"
    make_corpus(data, num_clips=3, sample_rate=16000, seed=0)
    best = tmp_path / "run" / "checkpoints" / "best_model"
    warm_up = RunOutputs.warm_up_first_calls

    def users_file_appears(self):
        best.mkdir(parents=True)
        (best / "notes.txt").write_text("mine", encoding="utf-8")
        return warm_up(self)

    monkeypatch.setattr(RunOutputs, "warm_up_first_calls", users_file_appears)
    run = dict(max_steps=3, val_fraction=0.02, learning_rate=1e-3)
    _, summary = train_tiny(tmp_path / "run", data, tiny_model_dir, **run)
    assert "warning: best model not " in capsys.readouterr().out  # exported (epoch eval) or updated (final)
    assert summary["best_step"] == 3 and summary["best_model"] is None  # trained weights beat the start
    assert "notes.txt" in summary["best_model_not_exported"]
    assert [p.name for p in best.iterdir()] == ["notes.txt"]
    words = best_model_words(summary)
    assert (
        words.startswith("no best model (the best weights, step 3, were not exported: ")
        and "notes.txt" in words
    )


def test_a_resumed_run_already_at_max_steps_says_why_it_trains_nothing(
    tmp_path, tiny_model_dir, tone_corpus, capsys
):
    """A resumed run keeps the --max_steps its run was given: one already reached trains no step, and the
    log says so instead of a silent zero-step session."""
    run = dict(max_steps=2, val_fraction=0.0)
    _, first = train_tiny(tmp_path, tone_corpus, tiny_model_dir, **run)
    capsys.readouterr()
    _, second = train_tiny(tmp_path, tone_corpus, tiny_model_dir, **run)
    assert first["steps"] == second["steps"] == 2 and second["stopped_reason"] == "max_steps"
    out = capsys.readouterr().out
    assert "max_steps: step 2 is --max_steps 2 already: no training step (--max_steps 0 lets" in out
    assert "schedule of this session" not in out  # a schedule no step follows: the note only puzzled
    _, third = train_tiny(tmp_path, tone_corpus, tiny_model_dir, **{**run, "max_steps": 3})
    assert third["steps"] == 3 and "note: the learning rate follows a schedule of this session's own" in (
        capsys.readouterr().out
    )


def test_a_run_resumed_at_max_steps_does_not_evaluate_the_same_weights_again(
    tmp_path, tiny_model_dir, tone_corpus, capsys
):
    """Its checkpoint's final evaluation scored these very weights: it stands for the final one (the
    report had two "final" rows for one step, and the evaluation's time was spent again)."""
    import json

    _, first = train_tiny(tmp_path, tone_corpus, tiny_model_dir, max_steps=2)
    capsys.readouterr()
    _, second = train_tiny(tmp_path, tone_corpus, tiny_model_dir, max_steps=2)
    assert second["steps"] == 2 and second["final_eval_tag"] == "final"
    assert second["final_val"] == first["final_val"] and second["final_eval_skipped"] is None
    assert "final evaluation skipped: no training step since the final evaluation" in capsys.readouterr().out
    records = [json.loads(x) for x in (tmp_path / "checkpoints" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r.get("event") == "eval"] == [0, 2]


def test_a_resumed_sessions_done_line_counts_its_own_steps_against_its_minutes():
    """`done: 68 steps in 1.1 min` after a session resumed at step 34 read as twice its speed: the
    minutes are this session's, the 68 the run's."""
    from train_vits import steps_words

    fresh = {"steps": 84, "session_steps": 84, "resumed_from_step": None}
    assert steps_words(fresh) == "84 steps"
    resumed = {"steps": 68, "session_steps": 34, "resumed_from_step": 34}
    assert steps_words(resumed) == "step 68 (34 steps this session)"
    assert steps_words({"steps": 1, "session_steps": 1, "resumed_from_step": None}) == "1 step"


def test_a_best_model_left_as_it_was_is_not_named_as_the_best(tmp_path, tiny_model_dir, capsys):
    """Resumed with a damaged export marker in best_model/, the run leaves the folder as it was (a
    warning says so); the done line must not name that folder as the best model of a step it lacks."""
    from train_vits import best_model_words

    data = tmp_path / "three"
    make_corpus(data, num_clips=3, sample_rate=16000, seed=0)
    run = dict(val_fraction=0.02, learning_rate=1e-3)
    _, first = train_tiny(tmp_path / "run", data, tiny_model_dir, max_steps=3, **run)
    best = tmp_path / "run" / "checkpoints" / "best_model"
    assert first["best_model"] == str(best)
    (best / ".vits_trainer_export.json").write_text("{not json", encoding="utf-8")
    capsys.readouterr()
    _, summary = train_tiny(tmp_path / "run", data, tiny_model_dir, max_steps=6, **run)
    out = capsys.readouterr().out
    assert "warning: best model not " in out, out[-2000:]
    assert summary["best_model_not_exported"], summary
    words = best_model_words(summary)
    assert not words.startswith("best model: "), words
    assert "left as it was" in words and str(best) in words, words


@pytest.mark.parametrize("extend", [False, True])
def test_characters_the_vocabulary_lacks_are_said_to_be_added_with_extend_vocab(tiny_model_dir, extend):
    """With --extend_vocab the list of missing characters said "(the tokenizer drops them)" and the
    next line "vocabulary extended by 3": the first was untrue."""
    from types import SimpleNamespace

    from transformers import VitsModel

    from vits_trainer.data.text import TextEncoder
    from vits_trainer.training.config import TrainConfig
    from vits_trainer.training.datasplit import check_vocabulary

    lines: list[str] = []
    cfg = TrainConfig(extend_vocab=extend)
    model, text = VitsModel.from_pretrained(tiny_model_dir), TextEncoder.from_pretrained(tiny_model_dir)
    check_vocabulary(cfg, model, text, SimpleNamespace(texts=["abc xyz"]), lines.append)
    assert lines[0].startswith("characters the model's vocabulary lacks ("), lines
    assert ("drops them" in lines[0]) != extend, lines
    if extend:
        assert "--extend_vocab adds them" in lines[0] and lines[1].startswith("vocabulary extended by 3")


def test_a_run_without_validation_says_why_its_final_weights_were_not_evaluated(
    tmp_path, tiny_model_dir, tone_corpus
):
    """--val_fraction 0: train_summary.json's final_eval_skipped said "not run", which is no reason."""
    _, summary = train_tiny(tmp_path, tone_corpus, tiny_model_dir, max_steps=1, val_fraction=0.0)
    assert summary["final_val"] is None
    assert summary["final_eval_skipped"] == "no validation clips to evaluate on"
