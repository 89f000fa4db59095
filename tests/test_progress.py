"""The progress display: a tqdm bar on a terminal that can show one, plain step lines otherwise."""

from __future__ import annotations

import fcntl
import os
import pty
import struct
import sys
import termios

import pytest

from vits_trainer.training.runtime import is_interactive


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
