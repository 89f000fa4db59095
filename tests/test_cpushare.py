"""The thread count follows the CPUs other processes leave free (vits_trainer/training/cpushare.py).

The load is simulated with fake /proc readings (a real competitor's share of a loaded CI machine is not
predictable); one test reads this machine's real /proc files.
"""

from __future__ import annotations

import sys

import pytest

from vits_trainer.training.cpushare import CpuShare, cpu_share, read_busy_ticks, read_own_ticks

HZ = 100


class FakeMachine:
    """A clock and /proc counters advanced by hand: `run(seconds, others, own)` in CPUs used."""

    def __init__(self):
        self.t, self.busy, self.own = 0.0, 0, 0

    def run(self, seconds: float, others: float, own: float) -> None:
        self.t += seconds
        self.busy += round((others + own) * seconds * HZ)
        self.own += round(own * seconds * HZ)


def governor(machine: FakeMachine, applied: list[int]) -> CpuShare:
    return CpuShare(
        {0, 1},
        2,
        interval=10.0,
        clock=lambda: machine.t,
        busy_ticks=lambda: machine.busy,
        own_ticks=lambda: machine.own,
        apply=applied.append,
        ticks_per_second=HZ,
    )


def test_threads_drop_under_load_and_come_back_when_it_ends():
    m, applied = FakeMachine(), []
    share = governor(m, applied)
    m.run(5, others=0.0, own=2.0)
    assert share.poll() is None  # not a whole window yet
    for _ in range(3):  # quiet: both CPUs stay ours
        m.run(10, others=0.0, own=1.9)
        assert share.poll() is None
    assert share.threads == 2 and applied == []

    m.run(10, others=1.3, own=0.7)  # two competitors took most of the machine
    assert share.poll() is None and share.others == pytest.approx(1.3)  # one window is not enough
    m.run(10, others=1.4, own=0.6)
    line = share.poll()
    assert applied == [1] and share.threads == 1
    assert line.startswith("threads: 2 -> 1") and "1.4 of this run's 2 CPUs" in line

    m.run(10, others=1.0, own=1.0)  # at one thread the competitors get a whole CPU: stays at 1
    assert share.poll() is None and share.threads == 1
    m.run(10, others=0.0, own=1.0)
    assert share.poll() is None
    m.run(10, others=0.1, own=1.0)
    assert share.poll().startswith("threads: 1 -> 2") and applied == [1, 2] and share.changes == 2


def test_one_busy_window_does_not_change_the_count():
    m, applied = FakeMachine(), []
    share = governor(m, applied)
    for others in (0.0, 1.8, 0.1, 1.7, 0.0, 0.2):  # spikes that never last two windows
        m.run(10, others=others, own=2 - others)
        assert share.poll() is None
    assert applied == [] and share.threads == 2


def test_settle_applies_one_window_at_once_before_the_start_evaluation():
    """The start evaluation's time is the budget's estimate: under load it is measured at the count the
    load calls for, not at 2 until two 10 s windows of training agree."""
    m, applied = FakeMachine(), []
    share = governor(m, applied)
    m.run(0.5, others=1.4, own=0.6)
    assert share.settle() is None and applied == []  # under a second: too short to judge
    m.run(1.0, others=1.4, own=0.6)
    line = share.settle()
    assert applied == [1] and share.threads == 1 and line.startswith("threads: 2 -> 1")
    m.run(10, others=0.0, own=1.0)  # later polls follow the load with their usual two windows
    assert share.poll() is None
    m.run(10, others=0.0, own=1.0)
    assert share.poll().startswith("threads: 1 -> 2") and applied == [1, 2]


def test_settle_on_a_quiet_machine_changes_nothing():
    m, applied = FakeMachine(), []
    share = governor(m, applied)
    m.run(2, others=0.1, own=1.9)
    assert share.settle() is None and applied == [] and share.threads == 2 and share.changes == 0


def test_wanted_threads_are_the_free_cpus_rounded_within_the_configured_count():
    share = CpuShare({0, 1, 2, 3}, 4, busy_ticks=lambda: 0, own_ticks=lambda: 0, apply=lambda n: None)
    assert [share.wanted(x) for x in (0.0, 0.4, 0.6, 2.2, 3.6, 9.0)] == [4, 4, 3, 2, 1, 1]
    share.max_threads = 2  # never more than configured (e.g. a share of an accelerate launch)
    assert share.wanted(0.0) == 2


def test_not_used_when_the_user_pinned_the_threads_or_there_is_one():
    assert cpu_share(2, user_pinned=True) is None
    assert cpu_share(1, user_pinned=False) is None


def test_proc_readers_parse_the_kernel_formats(tmp_path):
    stat = tmp_path / "stat"
    stat.write_text(
        "cpu  30 0 40 500 10 0 1 2 0 0\n"
        "cpu0 10 1 20 250 5 3 1 2 7 0\n"
        "cpu1 20 0 20 250 5 0 0 0 0 0\n"
        "cpu10 1000 0 0 0 0 0 0 0 0 0\n"
        "intr 1 2 3\n"
    )
    assert read_busy_ticks({0}, str(stat)) == 10 + 1 + 20 + 3 + 1 + 2  # iowait, idle, guest left out
    assert read_busy_ticks({0, 1}, str(stat)) == 37 + 40
    assert read_busy_ticks({10}, str(stat)) == 1000  # cpu10 is not cpu1
    own = tmp_path / "self_stat"
    own.write_text("4242 (python a) b) R 1 2 3 4 5 6 7 8 9 10 1234 56 0 0 20 0 3\n")
    assert read_own_ticks(str(own)) == 1234 + 56


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads Linux /proc")
def test_real_proc_files_give_a_plausible_share():
    import os
    import time

    cpus = os.sched_getaffinity(0)
    share = CpuShare(cpus, 2, interval=0.0, apply=lambda n: None)
    end = time.monotonic() + 0.5
    while time.monotonic() < end:  # CPU time of our own in the window
        pass
    share.poll()
    # others' use of our CPUs: never negative, never more than the CPUs (plus a clock tick's rounding)
    assert share.others is not None and 0.0 <= share.others <= len(cpus) + 0.1


def test_the_start_evaluation_runs_at_the_settled_count(tmp_path, tone_corpus, tiny_model_dir, monkeypatch):
    """The run settles the thread count (a fake governor, loaded before training) before it times the
    start evaluation; the old run timed it at 2 threads and changed the count during training."""
    from helpers import train_tiny

    from vits_trainer.training import loop
    from vits_trainer.training.outputs import RunOutputs

    m, order = FakeMachine(), []
    share = governor(m, [])
    share.apply = lambda n: order.append(("threads", n))
    m.run(2, others=1.4, own=0.6)  # the fake clock stops here: no poll during training
    monkeypatch.setattr(loop, "cpu_share", lambda threads, pinned: share)
    run_eval = RunOutputs.run_eval

    def recorded(self, tag, **kwargs):
        order.append(("eval", tag))
        return run_eval(self, tag, **kwargs)

    monkeypatch.setattr(RunOutputs, "run_eval", recorded)
    train_tiny(tmp_path, tone_corpus, tiny_model_dir, max_steps=1)
    assert order[:2] == [("threads", 1), ("eval", "start")]
