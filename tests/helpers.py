"""Settings for end-to-end runs on the tiny model and the tone-language corpus."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

from vits_trainer.training.config import TrainConfig

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable

# A tiny model trained from scratch: higher LR and a short warmup than a real fine-tuning run.
TINY_SETTINGS = dict(
    batch_size=8,
    gradient_accumulation_steps=1,
    learning_rate=2e-4,
    warmup_steps=10,
    discriminator_width=0.125,
    num_workers=0,
    benchmark_samples=32,
    val_fraction=0.1,
    eval_samples=0,
    freerun_samples=0,  # speaking from text costs seconds per evaluation here; test_freerun.py turns it on
    log_every=5,
    cpu=True,
    seed=0,
)


# --compile on in a tiny run (tests/test_compile.py on the CPU, tests/test_gpu.py on a GPU): 3 eager, 2
# compiling and 2 x 3 measured steps (compile_choice.py), with room for the steps that compile again
# or record CUDA graphs for a new shape or after a switch of scope (taken as compilation, not
# measured) and each epoch's short last step (not measured): 16 were short of the decision on a GPU's
# count of recordings
COMPILE_ON_STEPS = 28


def tiny_config(tmp: Path, data_dir: Path, model_dir: Path, **overrides) -> TrainConfig:
    settings = dict(
        TINY_SETTINGS,
        data_dir=str(data_dir),
        model_name=str(model_dir),
        checkpoint_dir=str(tmp / "checkpoints"),
        output_dir=str(tmp / "final_model"),
    )
    settings.update(overrides)
    cfg = dataclasses.replace(TrainConfig(), **settings)
    cfg.validate()
    return cfg


def train_tiny(tmp: Path, data_dir: Path, model_dir: Path, **overrides):
    """(session, summary) of the real Trainer run in-process with `tiny_config`."""
    import time

    import torch

    from vits_trainer.training.loop import Trainer
    from vits_trainer.training.session import build_session

    cfg = tiny_config(tmp, data_dir, model_dir, **overrides)
    torch.manual_seed(0)
    session = build_session(cfg, time.time())
    sent = len(SIGNALS_SENT)
    summary = Trainer(session).train()
    if summary["stopped_reason"] == "signal" and len(SIGNALS_SENT) == sent:
        stopped_from_outside()
    return session, summary


# The signals tests send to their own process (sigterm_at_batch): a run stopped by any other one was
# stopped from outside.
SIGNALS_SENT: list[int] = []


def stopped_from_outside() -> None:
    """Stop pytest: the in-process run's SIGTERM/SIGINT handler (loop.SignalStop) took a signal
    no test sent, a job manager's or a `timeout`'s meant for pytest, and ended the run gracefully after
    its step. The test would go on to fail on the steps it counts ("ended at step 4, expected 12"), a
    failure that is no result, and the signal would be lost on pytest."""
    import pytest

    pytest.exit(
        "an in-process training run stopped on a signal no test sent: this process was told to stop "
        "(a timeout, Ctrl-C); the test's results are not results",
        returncode=pytest.ExitCode.INTERRUPTED,
    )


def cli_settings(tmp: Path, data_dir: Path, model_dir: Path, **overrides) -> dict:
    """TINY_SETTINGS for a train_vits.py subprocess writing under `tmp` (pass through `cli_args`)."""
    settings = dict(
        TINY_SETTINGS,
        data_dir=data_dir,
        model_name=model_dir,
        checkpoint_dir=tmp / "checkpoints",
        output_dir=tmp / "final_model",
    )
    settings.update(overrides)
    return settings


def cli_args(cfg_overrides: dict) -> list[str]:
    """`--flag value` pairs for train_vits.py (booleans as --flag / --no-flag)."""
    args = []
    for key, value in cfg_overrides.items():
        if isinstance(value, bool):
            args.append(f"--{key}" if value else f"--no-{key}")
        else:
            args += [f"--{key}", str(value)]
    return args


def make_kl_infinite(monkeypatch, first: int, last: int) -> None:
    """Patch the generator so its KL term is Inf in training forwards number `first`..`last` (1-based)."""
    from vits_trainer.model.vits import VitsGenerator

    calls = {"n": 0}
    real_forward = VitsGenerator.forward

    def inf_kl_forward(self, *args, **kwargs):
        out = real_forward(self, *args, **kwargs)
        if self.training:
            calls["n"] += 1
            if first <= calls["n"] <= last:
                out.kl = out.kl * float("inf")
        return out

    monkeypatch.setattr(VitsGenerator, "forward", inf_kl_forward)


def sigterm_at_batch(monkeypatch, n: int = 2):
    """Patch the loop so that a real SIGTERM reaches this process as it moves its `n`th batch (1-based),
    as a job manager's stop would mid-run; returns the real move_batch, to undo it."""
    import os
    import signal

    import vits_trainer.training.loop as loop_module

    calls = {"n": 0}
    real_move = loop_module.move_batch

    def signal_at_batch(batch, device):
        calls["n"] += 1
        if calls["n"] == n:
            SIGNALS_SENT.append(signal.SIGTERM)
            os.kill(os.getpid(), signal.SIGTERM)
        return real_move(batch, device)

    monkeypatch.setattr(loop_module, "move_batch", signal_at_batch)
    return real_move


def ended_near_the_budget(summary: dict, target: float, fraction: float) -> bool:
    """A budget run used at least `fraction` of its budget, or ended earlier only because its own
    measurements said one more step would not fit: on a loaded machine (CI, other tests) a step can
    take several times its quiet time, and the stop rule then rightly leaves that much unused.
    `summary["budget_stop"]` is what the rule weighed when it stopped the run."""
    if summary["wall_seconds"] >= fraction * target:
        return True
    stop = summary.get("budget_stop")
    return bool(stop) and stop["seconds_left"] < stop["next_step_seconds"] + stop["final_reserve_seconds"]


def two_cpu_processes(script: Path, port: int) -> list[str]:
    """`accelerate launch` of `script` as two CPU processes (gloo; --multi_gpu is how accelerate's
    torchrun launcher starts them on a machine without GPUs), fp32, no dynamo."""
    return [
        PYTHON,
        "-m",
        "accelerate.commands.launch",
        "--multi_gpu",
        "--num_processes",
        "2",
        "--num_machines",
        "1",
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
        "--main_process_port",
        str(port),
        str(script),
    ]


def all_finite(*modules) -> bool:
    """Every parameter of `modules` is finite (no NaN/Inf reached the weights)."""
    import torch

    return all(bool(torch.isfinite(p).all()) for m in modules for p in m.parameters())


def refuse_reading(monkeypatch, *paths: Path) -> None:
    """`Path.read_bytes` of `paths` raises PermissionError, as for a file without read permission (root,
    who runs these tests, reads any file whatever its mode)."""
    read_bytes = Path.read_bytes

    def refusing(self):
        if self in paths:
            raise PermissionError(13, "Permission denied", str(self))
        return read_bytes(self)

    monkeypatch.setattr(Path, "read_bytes", refusing)
