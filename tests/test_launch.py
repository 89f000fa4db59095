"""What a multi-process launch says in the environment (vits_trainer/launch.py), read without a launch."""

from __future__ import annotations

from vits_trainer.errors import UserError, run_cli
from vits_trainer.launch import launch_warnings, process_rank
from vits_trainer.runlock import is_main_process

RANK_WARNING = "warning: RANK='1' is not a process number: this process counts as the main one (0)"


def test_a_rank_beyond_the_launchs_processes_counts_as_the_main_process(monkeypatch, capsys):
    # RANK=1 left over in a shell with no WORLD_SIZE: accelerate ran the one process as the main one,
    # while this tool took it for another process of a launch: its error lines went unsaid and it
    # took no run lock on its checkpoint folder
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.setenv("RANK", "1")
    assert process_rank() == 0 and is_main_process()
    assert launch_warnings() == [RANK_WARNING]

    def fails(argv):
        raise UserError("--data_dir x: no such folder")

    assert run_cli(fails) == 2
    assert capsys.readouterr().err == "error: --data_dir x: no such folder\n"
    monkeypatch.setenv("WORLD_SIZE", "2")  # a launch of two: the second process
    assert process_rank() == 1 and not is_main_process() and launch_warnings() == []


def test_a_stray_variable_is_said_by_the_main_process_only(monkeypatch):
    # a launcher that sets RANK and WORLD_SIZE but not LOCAL_WORLD_SIZE, under a shell that left
    # LOCAL_WORLD_SIZE=auto: every process printed the same warning
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "auto")
    monkeypatch.setenv("RANK", "0")
    assert len(launch_warnings()) == 1
    monkeypatch.setenv("RANK", "1")
    assert launch_warnings() == []
