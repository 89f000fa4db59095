"""bench/gpu_check.sh runs rarely, on a borrowed GPU machine with minutes to spare: a stage that dies on a
misspelt flag or a moved test file wastes them. Here each of its commands is parsed by the command's own
argument parser (stopped right after parsing: nothing runs), and each test file it names exists. The code
that runs only there (tests/test_gpu.py, skipped without CUDA, and the benchmarks) is read for the
attributes it takes of a session, a GanStep, a Budget or a TrainState: a renamed one fails here, not
minutes into a lent machine's call."""

from __future__ import annotations

import argparse
import ast
import dataclasses
import importlib
import inspect
import re
import runpy
import shlex
import sys
import textwrap

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


def test_pytest_runs_where_pytest_xdist_is_missing_with_the_stages_override():
    """pyproject.toml's addopts name xdist's `-n`: without the plugin (`-p no:xdist` stands in for a lent
    machine, which lacks it) pytest refuses them, and the stages' override is what lets it start."""
    import subprocess

    base = [
        sys.executable,
        "-m",
        "pytest",
        "-p",
        "no:xdist",
        "--collect-only",
        "-q",
        "tests/test_gpu_check.py",
    ]
    refused = subprocess.run(base, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert refused.returncode != 0 and "-n" in refused.stderr, refused.stderr
    started = subprocess.run(
        [*base, "--override-ini=addopts="], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert started.returncode == 0, started.stdout[-2000:] + started.stderr[-2000:]


def test_every_stage_has_a_command():
    stages = re.search(r"stages=\((\w[^)]*)\)", SCRIPT.read_text(encoding="utf-8")).group(1).split()
    assert stages and [s for s, _ in _stage_commands()] == stages


@pytest.mark.parametrize("stage,argv", _stage_commands(), ids=lambda v: v if isinstance(v, str) else "")
def test_each_stage_command_parses(stage, argv, monkeypatch):
    assert argv[0] == "python", argv
    if argv[1:3] == ["-m", "pytest"]:
        # one process, without pyproject.toml's `-n auto`: the lent machines have no pytest-xdist
        assert "--override-ini=addopts=" in argv, argv
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
    whole = (budget.training_left_by_budget(), 0)
    assert budget.training_left() != whole  # --max_steps matters to the real method
    original = list(inspect.signature(Budget.training_left).parameters)[1:]  # after self
    assert list(inspect.signature(training_left_ignoring_max_steps).parameters)[1:] == original
    with mock.patch.object(Budget, "training_left", training_left_ignoring_max_steps):
        assert budget.training_left() == whole
        budget.session_left()  # the project's own callers go through it too


def _attributes(cls) -> set[str]:
    """What an instance of `cls` has: its class's names, its dataclass fields, what its methods set on self."""
    names = set(dir(cls)) | (
        {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set()
    )
    for node in ast.walk(ast.parse(textwrap.dedent(inspect.getsource(cls)))):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            if isinstance(node.value, ast.Name) and node.value.id == "self":
                names.add(node.attr)
    return names


def test_gpu_only_code_takes_attributes_that_exist():
    """A name is typed by what made it (build_session, GanStep, train_tiny's first value...) or by its
    parameter's annotation, and `session.budget` by Session's own annotation; each attribute it takes
    must exist. Neither tests/test_gpu.py nor the benchmarks run in CI, and Budget's step times and the
    unwrapped networks' names have changed before."""
    from vits_trainer.training.budget import Budget
    from vits_trainer.training.session import Session
    from vits_trainer.training.step import GanStep
    from vits_trainer.training.trainstate import TrainState

    classes = {c.__name__: c for c in (Session, GanStep, Budget, TrainState)}
    has = {name: _attributes(c) for name, c in classes.items()}
    made_by = {
        "build_session": "Session",
        "quiet_session": "Session",
        "GanStep": "GanStep",
        "gan_step": "GanStep",
    }
    first_of = {"train_tiny": "Session", "gpu_run": "Session", "train_and_read_metrics": "Session"}

    def called(node):
        function = getattr(node, "func", None)
        return getattr(function, "id", None) or getattr(function, "attr", None)

    def types_in(scope) -> dict[str, str]:
        types = {}
        arguments = getattr(scope, "args", None)
        for arg in (arguments.args + arguments.kwonlyargs) if arguments else []:
            note = arg.annotation
            note = getattr(note, "id", None) or getattr(note, "value", None)
            if note in classes:
                types[arg.arg] = note
        for node in ast.walk(scope):
            if isinstance(node, ast.Assign) and len(node.targets) == 1:
                target, maker = node.targets[0], called(node.value)
                if isinstance(target, ast.Name) and maker in made_by:
                    types[target.id] = made_by[maker]
                elif (
                    isinstance(target, ast.Tuple)
                    and maker in first_of
                    and isinstance(target.elts[0], ast.Name)
                ):
                    types[target.elts[0].id] = first_of[maker]
        return types

    def type_of(node, types) -> str | None:
        if isinstance(node, ast.Name):
            return types.get(node.id)
        owner = type_of(node.value, types) if isinstance(node, ast.Attribute) else None
        note = classes[owner].__annotations__.get(node.attr) if owner else None
        return note if note in classes else None

    missing, checked = set(), 0
    for path in [ROOT / "tests" / "test_gpu.py", *sorted((ROOT / "bench").glob("*.py"))]:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for scope in [tree, *(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef))]:
            types = types_in(scope)
            for node in ast.walk(scope):
                owner = type_of(node.value, types) if isinstance(node, ast.Attribute) else None
                if owner:
                    checked += 1
                    if node.attr not in has[owner]:
                        missing.add(f"{path.relative_to(ROOT)}:{node.lineno}: {owner}.{node.attr}")
    assert checked > 100, checked  # the typing still finds the sessions and steps
    assert not missing, sorted(missing)


def test_bench_train_naive_loop_builds_the_runners_generator(tone_corpus, tiny_model_dir, monkeypatch):
    """`bench_train.py defaults` (the gpu_session.sh plan's first measurement, and the fp16, eager and
    cudnn stages) and `baseline` start with the naive loop, which builds the runner's generator with
    networks.make_generator: it took the device as a fourth argument and the loop was a TypeError on
    the lent machine. Run here on the CPU with the tiny model up to the discriminator that follows
    (the loop itself takes most of a minute on a CPU)."""
    from bench import bench_train
    from vits_trainer.model import discriminator

    class Built(Exception):
        pass

    def stop(*args, **kwargs):
        raise Built

    monkeypatch.setattr(discriminator, "VitsDiscriminator", stop)
    with pytest.raises(Built):
        bench_train.baseline_throughput(tone_corpus, tiny_model_dir, 0.125, batch=2, steps=1)
