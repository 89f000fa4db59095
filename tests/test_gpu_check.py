"""bench/gpu_check.sh runs rarely, on a borrowed GPU machine with minutes to spare: a stage that dies on a
misspelt flag or a moved test file wastes them. Here each of its commands is parsed by the command's own
argument parser (stopped right after parsing: nothing runs), and each test file it names exists."""

from __future__ import annotations

import argparse
import importlib
import re
import runpy
import shlex
import sys

import pytest

from tests.helpers import ROOT

SCRIPT = ROOT / "bench" / "gpu_check.sh"


class Parsed(Exception):
    """Raised in place of running the command once its arguments parsed."""


def _stage_commands() -> list[tuple[str, list[str]]]:
    """(stage, argv) for each `STAGE) run STAGE COMMAND ;;` line, continuations joined, $out filled in."""
    text = SCRIPT.read_text(encoding="utf-8").replace("\\\n", " ")
    found = []
    for stage, command in re.findall(r"^\s*(\w+)\) run \w+ (.+?) ;;", text, flags=re.M):
        found.append((stage, shlex.split(command.replace("$out", "/tmp/gpu_check_logs").replace('"', ""))))
    return found


def test_every_stage_has_a_command():
    stages = re.search(r"stages=\((\w[^)]*)\)", SCRIPT.read_text(encoding="utf-8")).group(1).split()
    assert stages and [s for s, _ in _stage_commands()] == stages


@pytest.mark.parametrize("stage,argv", _stage_commands(), ids=lambda v: v if isinstance(v, str) else "")
def test_each_stage_command_parses(stage, argv, monkeypatch):
    assert argv[0] == "python", argv
    if argv[1:3] == ["-m", "pytest"]:
        files = [a for a in argv[3:] if not a.startswith("-")]
        assert files and all((ROOT / f.split("::")[0]).is_file() for f in files), files
        for path in files:  # the file imports (its tests are skipped here, not its imports)
            importlib.import_module(path.split("::")[0].removesuffix(".py").replace("/", "."))
        for test in (f.split("::") for f in files if "::" in f):  # file::test[id]: the test exists
            name, _, ids = test[1].partition("[")
            function = getattr(importlib.import_module(test[0].removesuffix(".py").replace("/", ".")), name)
            if ids:  # pytest's id of a parametrized case: its values joined by "-"
                values = [
                    str(v)
                    for mark in getattr(function, "pytestmark", [])
                    if mark.name == "parametrize"
                    for v in mark.args[1]
                ]
                assert all(part in values for part in ids.rstrip("]").split("-")), (test, values)
        return
    script = ROOT / argv[1]
    assert script.is_file(), argv
    original = argparse.ArgumentParser.parse_args

    def parse_then_stop(self, args=None, namespace=None):
        original(self, args, namespace)  # a wrong flag or value exits 2 here, as it would on the GPU
        raise Parsed

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_then_stop)
    monkeypatch.setattr(sys, "argv", [str(script), *argv[2:]])
    monkeypatch.chdir(ROOT)
    with pytest.raises(Parsed):
        runpy.run_path(str(script), run_name="__main__")


def test_the_session_wrapper_runs_known_stages():
    """bench/gpu_session.sh's default plan names gpu_check.sh stages (a typo would cost a lent call)."""
    wrapper = (ROOT / "bench" / "gpu_session.sh").read_text(encoding="utf-8")
    plan = re.search(r"set -- ((?:\w+ ?)+)", wrapper).group(1).split()
    known = {s for s, _ in _stage_commands()}
    assert plan and plan[0] == "probe" and set(plan) <= known, plan


def test_bench_train_defaults_replaces_training_left_with_a_compatible_function():
    """`bench_train.py defaults` (the gpu_session.sh plan's first measurement) runs the trainer with
    Budget.training_left replaced; a replacement that no longer takes the method's arguments crashed
    the stage after its corpus, model and session were built (its lambda took one argument too many)."""
    import inspect
    from unittest import mock

    from bench.bench_train import training_left_ignoring_max_steps
    from vits_trainer.training.budget import Budget

    clock = [1000.0]
    budget = Budget(3600, process_start=1000.0, clock=lambda: clock[0], max_steps=3)
    budget.start_training()
    for _ in range(4):  # a step time, so that --max_steps would shorten what is left
        clock[0] += 10.0
        budget.observe_step(10.0, 8)
    whole = Budget.training_left(budget, 0)
    assert Budget.training_left(budget, 3) != whole  # --max_steps matters to the real method
    original = list(inspect.signature(Budget.training_left).parameters)[1:]  # after self
    assert list(inspect.signature(training_left_ignoring_max_steps).parameters)[1:] == original
    with mock.patch.object(Budget, "training_left", training_left_ignoring_max_steps):
        assert budget.training_left() == whole
        assert budget.training_left(3) == whole
        assert budget.training_left(max_steps=3) == whole
        budget.session_left(3)  # the project's own callers go through it too
