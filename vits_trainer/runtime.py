"""Process-level set-up: start time, device and precision, the Accelerator, logging."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from .errors import UserError


def process_start_time() -> float:
    """Wall time this process started: the budget counts from here, interpreter start-up included."""
    try:
        import psutil

        return psutil.Process().create_time()
    except Exception:  # pragma: no cover - psutil ships with accelerate
        return time.time()


def share_cpus_between_processes() -> None:
    """Several processes on one machine (accelerate launch): give each its share of the cores.

    Call before torch/numba are imported. numba's OpenMP threads otherwise spin against the other
    processes' work (seen: two CPU processes on two cores made steps 1.5-23 s instead of 0.6 s).
    """
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    if local > 1:
        share = str(max(1, (os.cpu_count() or 1) // local))
        os.environ.setdefault("NUMBA_NUM_THREADS", share)
        os.environ.setdefault("OMP_NUM_THREADS", share)


def resolve_precision(requested: str, cpu: bool, log=print) -> str:
    """accelerate's mixed_precision value for this machine; impossible requests fall back with a warning."""
    import torch

    cuda = torch.cuda.is_available() and not cpu
    if requested == "auto":
        return "fp16" if cuda else "no"
    if requested == "no":
        return "no"
    if not cuda and requested == "bf16":
        return "bf16"  # CPU autocast supports bf16 (fast only on CPUs with bf16 units)
    if not cuda:
        log(f"warning: --{requested} needs a CUDA GPU; training in fp32 on the CPU")
        return "no"
    if requested == "bf16" and not torch.cuda.is_bf16_supported():
        log("warning: this GPU has no bf16 support; using fp16 instead")
        return "fp16"
    return requested


def make_accelerator(
    mixed_precision: str, cpu: bool, report_to: str, project_dir: Path, find_unused_parameters: bool = False
):
    from accelerate import Accelerator
    from accelerate.utils import DistributedDataParallelKwargs, GradScalerKwargs

    handlers = [
        # 65536 (the default) overflows for the first dozens of steps and was seen driving losses to NaN
        GradScalerKwargs(init_scale=1024.0, growth_interval=1000),
        # transformers' text encoder skips layers at random (layerdrop): their weights get no gradient,
        # which DDP must be told about (it costs a graph traversal per step, so only when needed)
        DistributedDataParallelKwargs(find_unused_parameters=find_unused_parameters),
    ]
    log_with = None if report_to == "none" else report_to
    if log_with == "tensorboard":
        try:
            import tensorboard  # noqa: F401
        except ImportError:
            raise UserError(
                "--report_to tensorboard needs the tensorboard package: pip install tensorboard"
            ) from None
    if log_with == "wandb":
        try:
            import wandb  # noqa: F401
        except ImportError:
            raise UserError("--report_to wandb needs the wandb package: pip install wandb") from None
    if int(os.environ.get("WORLD_SIZE", "1")) == 1:
        # accelerate keeps one process-wide state; a second run in the same process (a notebook, the
        # tests) may want another precision, so single-process runs start it afresh
        from accelerate.state import AcceleratorState, GradientState

        AcceleratorState._reset_state(reset_partial_state=False)
        GradientState._reset_state()
    return Accelerator(
        mixed_precision=mixed_precision,
        cpu=cpu,
        kwargs_handlers=handlers,
        log_with=log_with,
        project_dir=str(project_dir),
    )


def quiet_transformers() -> None:
    """transformers' per-load/save progress bars and load reports only clutter a training log."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()


def git_revision() -> str | None:
    root = Path(__file__).resolve().parent.parent
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True, timeout=5
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


class Logger:
    """Lines for the user from the main process only; plain print so tests and logs can read them."""

    def __init__(self, enabled: bool = True):
        self.enabled = enabled
        self.bar = None  # a tqdm bar to print around, when one is active

    def __call__(self, message: str) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.write(message, file=sys.stdout)
        else:
            print(message, flush=True)


def is_interactive() -> bool:
    return sys.stderr.isatty() and os.environ.get("TERM") != "dumb"
