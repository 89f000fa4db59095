"""The progress display: a tqdm bar on a terminal that can show one, plain step lines otherwise."""

from __future__ import annotations

import fcntl
import os
import pty
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest

from tests.helpers import PYTHON, ROOT
from tests.test_prepare_fixtures import speech, write_audio
from vits_trainer.terminal import is_interactive


@pytest.fixture
def terminal(monkeypatch):
    """A function that puts sys.stderr on a pseudo-terminal of a size (rows, columns). Called in the
    test's body: pytest's output capture sets sys.stderr again between a fixture and the test."""
    main, follower = pty.openpty()
    stream = os.fdopen(follower, "w")
    monkeypatch.setenv("TERM", "xterm")

    def on_terminal(rows: int, columns: int) -> None:
        fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
        monkeypatch.setattr(sys, "stderr", stream)

    yield on_terminal
    monkeypatch.undo()
    stream.close()
    os.close(main)


def test_a_sized_terminal_gets_the_bar(terminal):
    terminal(40, 120)
    assert is_interactive()


@pytest.mark.parametrize("rows, columns", [(0, 0), (0, 120), (40, 0)])
def test_a_terminal_without_a_size_gets_plain_lines(terminal, rows, columns):
    # `docker run -t` or `script` without a terminal give a pty of size 0: tqdm then draws nothing at
    # all, and a run's only progress would be its evaluation lines
    terminal(rows, columns)
    assert not is_interactive()


class _Log:
    bar = None

    def __call__(self, message: str) -> None:
        print(message)

    def print_around(self, bar) -> None:
        self.bar = bar


class _Budget:
    def session_left(self) -> float:
        return 378.0


def draw_the_bar_at(monkeypatch, step: int) -> None:
    """A progress bar on a terminal, its total set (636 steps, 330 done), updated once at `step`, closed."""
    import torch

    from vits_trainer.training import reporting

    monkeypatch.setattr(reporting, "is_interactive", lambda: True)
    progress = reporting.Progress(_Log(), True, torch.device("cpu"))
    progress.set_total(636, 330)
    values = {"loss_g": 63.3, "mel": 1.21, "samples_per_second": 7.4, "data_wait_fraction": 0.01}
    progress.update(step, values, _Budget(), epoch_eta=15.0)
    progress.close()


def test_the_bar_shows_one_time_left_the_runs(monkeypatch, capsys):
    # tqdm's own estimate (steps left of a plan that moves, at a rate that counts the evaluations)
    # disagreed with the run's: "[00:47<08:15, ..., ETA=6:18]"; the bar keeps the budget's only
    draw_the_bar_at(monkeypatch, 334)
    drawn = capsys.readouterr().err.replace("\r", "\n").strip().splitlines()[-1]
    assert "334/636" in drawn and "ETA=6:18" in drawn and "epoch ETA=0:15" in drawn, drawn
    assert "<" not in drawn and "?" not in drawn, drawn


def test_train_log_keeps_the_step_lines_a_bar_shows(monkeypatch, tmp_path, capsys):
    # on a terminal the losses were only in the bar: train.log went from one evaluation to the next
    # with nothing between, and a closed terminal took the run's progress with it
    from vits_trainer.training.runtime import LogCopy, Logger

    copy = LogCopy()
    copy.to(tmp_path / "train.log")
    monkeypatch.setattr(Logger, "copy", copy)
    draw_the_bar_at(monkeypatch, 340)
    lines = (tmp_path / "train.log").read_text(encoding="utf-8").splitlines()
    assert "step 340 | loss 63.300 | mel 1.210 | samples/s 7.4 | wait 1% | epoch ETA 0:15 | ETA 6:18" in lines
    assert "step 340 |" not in capsys.readouterr().out  # the terminal has the bar, not the line too


def test_a_longer_plan_says_why_the_percentage_fell(monkeypatch, capsys):
    # a re-plan from 636 to 740 steps took the bar from 61% to 54%, which read as lost progress
    import torch

    from vits_trainer.training import reporting

    monkeypatch.setattr(reporting, "is_interactive", lambda: True)
    progress = reporting.Progress(_Log(), True, torch.device("cpu"))
    progress.set_total(636, 388)
    progress.set_total(740, 400)
    drawn = capsys.readouterr().err.replace("\r", "\n").strip().splitlines()[-1]
    assert "plan 636->740 steps" in drawn and "400/740" in drawn, drawn
    progress.set_total(700, 420)  # a shorter plan: the percentage rose, nothing to explain
    drawn = capsys.readouterr().err.replace("\r", "\n").strip().splitlines()[-1]
    assert "plan" not in drawn and "420/700" in drawn, drawn
    progress.close()


def piped(script: str, *args: str, cwd: Path) -> str:
    """stdout and stderr of a CLI whose output goes to a pipe, as on Kaggle or Colab; the libraries'
    own switches are left unset and their caches fresh, so a bar they would draw is drawn."""
    env = {k: v for k, v in os.environ.items() if not k.endswith("_DISABLE_PROGRESS_BARS")}
    env.update(HF_HOME=str(cwd / "hf_home"), HF_HUB_OFFLINE="1")
    proc = subprocess.run(
        [PYTHON, str(ROOT / script), *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        timeout=600,
    )
    log = proc.stdout.decode()  # not text=True: it reads each "\r" as a line end
    assert proc.returncode == 0, log[-3000:]
    return log


def assert_no_bar(log: str) -> None:
    # a bar in a log file: each redraw after a "\r", "reading wavs:  50%|#####     | 80/160 [...]"
    assert "\r" not in log and "%|" not in log, log[:3000]


def test_a_training_log_has_no_progress_bar(tmp_path):
    # the clip cache's "reading wavs" bar came before the plain step lines
    log = piped("train_vits.py", "--demo", "--max_steps", "2", cwd=tmp_path)
    assert_no_bar(log)
    assert "160 clips, 0.07 hours" in log  # what the bar showed, said once


def test_a_prepare_log_has_no_progress_bar(tmp_path):
    # datasets drew "Generating train split" for a parquet source
    from datasets import Audio, Dataset

    clips = [str(write_audio(tmp_path / f"c{i}.wav", speech(), 22050)) for i in range(3)]
    rows = Dataset.from_dict({"audio": clips, "text": ["abc", "def", "gh"]})
    rows.cast_column("audio", Audio(decode=False)).to_parquet(str(tmp_path / "train.parquet"))
    log = piped("prepare_data.py", "--source", "train.parquet", "--data_dir", "out", cwd=tmp_path)
    assert_no_bar(log)
    assert "kept 3 of 3 rows" in log


def test_library_bars_are_switched_off_only_off_a_terminal(terminal, monkeypatch):
    from vits_trainer.terminal import LIBRARY_BAR_SWITCHES, no_library_bars_off_a_terminal

    for name in LIBRARY_BAR_SWITCHES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_DATASETS_DISABLE_PROGRESS_BARS", "0")  # the user's choice is kept
    no_library_bars_off_a_terminal()  # pytest's captured output: no terminal
    assert os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] == "1"
    assert os.environ["HF_DATASETS_DISABLE_PROGRESS_BARS"] == "0"
    monkeypatch.delenv("HF_HUB_DISABLE_PROGRESS_BARS")
    terminal(40, 120)
    no_library_bars_off_a_terminal()
    assert "HF_HUB_DISABLE_PROGRESS_BARS" not in os.environ
