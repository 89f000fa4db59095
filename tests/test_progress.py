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


def ticking(step: float):
    """A clock that moves `step` seconds each time it is read: a run as slow as wanted, at no cost."""
    now = [1000.0]

    def clock() -> float:
        now[0] += step
        return now[0]

    return clock


def prepare_in_process(tmp_path: Path, monkeypatch, capsys, step: float, on_terminal: bool):
    """prepare_data.py on a 10-clip corpus in this process, its conversion's clock moving `step` s a
    read; (stdout, stderr)."""
    import functools

    import prepare_data
    from vits_trainer.data import prepare_convert
    from vits_trainer.data.synthetic import make_corpus
    from vits_trainer.errors import run_cli

    make_corpus(tmp_path / "lj", num_clips=10)
    monkeypatch.setattr(prepare_convert, "is_interactive", lambda: on_terminal)
    lines = functools.partial(prepare_convert.ProgressLines, clock=ticking(step))
    monkeypatch.setattr(prepare_convert, "ProgressLines", lines)
    args = ["--source", str(tmp_path / "lj"), "--data_dir", str(tmp_path / "out"), "--num_workers", "1"]
    assert run_cli(prepare_data.main, args) == 0
    captured = capsys.readouterr()
    return captured.out, captured.err


def test_a_long_prepare_off_a_terminal_says_how_far_it_is(tmp_path, monkeypatch, capsys):
    # a notebook cell or `| tee log` showed nothing between the first line and the summary for the
    # minutes of a large corpus's conversion: working or stuck?
    out, err = prepare_in_process(tmp_path, monkeypatch, capsys, step=31.0, on_terminal=False)
    assert "\r" not in out + err and "%|" not in err, (out, err)
    lines = [line for line in out.splitlines() if line.startswith("preparing:")]
    assert lines, out
    counts = []
    for line in lines:
        done, total = (int(n.replace(",", "")) for n in line.split()[1:4:2])
        assert total == 10 and "so far" in line, line
        counts.append(done)
    assert counts == sorted(set(counts)) and counts[-1] < 10, lines  # the summary says the end
    assert "about" in lines[-1] and "left" in lines[-1], lines
    assert out.index(lines[-1]) < out.index("kept 10 of 10 rows"), out


def test_a_short_prepare_off_a_terminal_is_the_summary_alone(tmp_path, monkeypatch, capsys):
    # a clock that stands still: a run done before the first line is due (no test waits on the real one)
    out, _ = prepare_in_process(tmp_path, monkeypatch, capsys, step=0.0, on_terminal=False)
    assert "preparing:" not in out, out
    slow, _ = prepare_in_process(tmp_path / "again", monkeypatch, capsys, step=29.0, on_terminal=False)
    assert "preparing:" in slow, slow  # the same run, 29 s a clock read: there would be lines


def test_a_prepare_on_a_terminal_has_the_bar_not_the_lines(tmp_path, monkeypatch, capsys):
    out, err = prepare_in_process(tmp_path, monkeypatch, capsys, step=31.0, on_terminal=True)
    assert "preparing:" not in out, out
    assert "preparing:" in err and "10/10" in err, err  # tqdm's bar


def test_progress_lines_are_due_every_interval_and_never_at_the_end():
    from vits_trainer.data.prepare_convert import ProgressLines

    said: list[str] = []
    now = [0.0]
    lines = ProgressLines(13_100, said.append, clock=lambda: now[0])
    for seconds, settled, converted in [(10, 0, 100), (45, 1_000, 200), (50, 0, 100), (80, 0, 100)]:
        now[0] = seconds
        lines.update(converted, settled)
    # rows settled without converting (reused WAVs) say nothing of the rate: 300 converted in 45 s
    assert said == [
        "preparing: 1,300 of 13,100 clips (9 %), 0:45 so far, about 29:30 left",
        "preparing: 1,500 of 13,100 clips (11 %), 1:20 so far, about 30:56 left",
    ], said
    now[0] = 200
    lines.update(11_600)
    assert len(said) == 2  # the last clip: the summary follows


def test_prepare_lines_are_sent_at_once(monkeypatch):
    # piped, print's buffer kept a run's lines until it ended: its progress lines came with the summary
    import io

    from vits_trainer.data.prepare import prepare, say

    raw = io.BytesIO()
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(raw, encoding="utf-8"))  # a pipe's buffering
    assert prepare.__defaults__ == (say,)
    say("preparing: 1 of 2 clips (50 %), 0:31 so far, about 0:31 left")
    assert raw.getvalue() == b"preparing: 1 of 2 clips (50 %), 0:31 so far, about 0:31 left\n"
