"""Process-level set-up: start time, device and precision, the Accelerator, logging."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

from ..errors import UserError
from ..launch import launch_warnings, local_processes, stray_world_size, world_size


def process_start_time() -> float:
    """Wall time this process started: the budget counts from here, interpreter start-up included."""
    try:
        import psutil

        return psutil.Process().create_time()
    except Exception:  # pragma: no cover - psutil ships with accelerate
        return time.time()


# What `configure_threads` set (or found set by the user), for the run's log line, summary and checkpoint.
THREAD_SETTINGS: dict[str, str | int | None] = {}
_THREAD_VARS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_NUM_THREADS", "NUMBA_NUM_THREADS")
# GNU OpenMP (torch's and numba's CPU builds) spins this many iterations before a waiting thread sleeps
SPIN_COUNT = "10000"


def available_cpus() -> int:
    """CPUs this process may run on (its affinity mask: taskset, cgroup cpusets), else the machine's."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def configure_threads() -> dict[str, str | int | None]:
    """Threads that stop spinning soon when idle, as many as this process's share of its CPUs.

    Call before torch/numba are imported (they read these once, at load); the CLIs do, at the top, so
    processes that accelerate launches get it too. A variable the user set is kept (setdefault). Why:
    GNU OpenMP threads (torch's and numba's) busy-wait ~300k iterations between parallel regions by
    default, so beside another CPU-bound process (a second run, a notebook, the DataLoader workers)
    they spin against it and the step stalls; never spinning (OMP_WAIT_POLICY=PASSIVE) costs the quiet
    machine dearly, because the step has many small parallel regions. A short spin keeps both
    (bench/bench_threads.py; figures in docs/performance.md). The thread count is sized to the CPUs this
    process may use, split between the processes of a multi-process launch (LOCAL_WORLD_SIZE), not to
    the load average: the load at start-up says little about the hours after it. DataLoader workers
    need nothing here: torch sets one thread in each worker itself.
    """
    for warning in launch_warnings():  # the log is not open yet: straight to the terminal
        print(warning, file=sys.stderr)
    share = str(max(1, available_cpus() // local_processes()))
    user = {name for name in _THREAD_VARS if os.environ.get(name)}
    if not os.environ.get("OMP_WAIT_POLICY"):  # a policy the user chose overrides the spin count anyway
        os.environ.setdefault("GOMP_SPINCOUNT", SPIN_COUNT)
    os.environ.setdefault("OMP_NUM_THREADS", share)
    os.environ.setdefault("NUMBA_NUM_THREADS", share)
    THREAD_SETTINGS.clear()
    THREAD_SETTINGS.update({name: os.environ.get(name) for name in _THREAD_VARS})
    THREAD_SETTINGS["available_cpus"] = available_cpus()
    THREAD_SETTINGS["set_by_user"] = ",".join(sorted(user)) or None
    return dict(THREAD_SETTINGS)


def thread_report() -> dict[str, str | int | None]:
    """The thread settings in effect (after torch loaded): for the log line, summary and trainer_state."""
    import torch

    report: dict[str, str | int | None] = {
        "torch_threads": torch.get_num_threads(),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        "gomp_spincount": os.environ.get("GOMP_SPINCOUNT"),
        "numba_threads": os.environ.get("NUMBA_NUM_THREADS"),
        "available_cpus": available_cpus(),
        "configured": bool(THREAD_SETTINGS),
        "set_by_user": THREAD_SETTINGS.get("set_by_user"),
    }
    return report


def wait_policy_words(report: dict) -> str:
    """How idle OpenMP threads wait, in words: OMP_WAIT_POLICY, else what GOMP_SPINCOUNT makes of it."""
    return report.get("omp_wait_policy") or (
        f"spin {report['gomp_spincount']} then sleep"
        if report.get("gomp_spincount")
        else "default (spinning)"
    )


def describe_threads(report: dict) -> str:
    policy = wait_policy_words(report)
    line = (
        f"threads: torch {report['torch_threads']}, numba {report.get('numba_threads') or 'default'}, "
        f"OpenMP wait policy {policy}, {report['available_cpus']} CPUs available"
    )
    if report.get("set_by_user"):
        line += f" (from the environment: {report['set_by_user']})"
    elif not report.get("configured"):
        line += " (not set by the trainer: torch was loaded before train_vits.py could set them)"
    return line


def native_bf16() -> bool:
    """The current GPU computes in bf16 natively (Ampere, compute capability 8.0, and newer).
    `torch.cuda.is_bf16_supported()` also says yes on older GPUs that only emulate it (slowly): a T4
    (7.5) trains in fp16 with a loss scaler instead."""
    import torch

    return torch.cuda.get_device_capability() >= (8, 0)


def resolve_precision(requested: str, cpu: bool, log=print) -> str:
    """accelerate's mixed_precision value for this machine; impossible requests fall back with a warning."""
    import torch

    cuda = torch.cuda.is_available() and not cpu
    if requested == "auto":
        if not cuda:
            return "no"
        return "bf16" if native_bf16() else "fp16"
    if requested == "no":
        return "no"
    if not cuda and requested == "bf16":
        return "bf16"  # CPU autocast supports bf16 (fast only on CPUs with bf16 units)
    if not cuda:
        log(f"warning: --{requested} needs a CUDA GPU; training in fp32 on the CPU")
        return "no"
    if requested == "bf16" and not native_bf16():
        log("warning: this GPU has no bf16 support; using fp16 instead")
        return "fp16"
    return requested


def resolve_mas_backend(requested: str, device, log=print) -> str:
    """--mas_backend for this device: `triton` where Triton cannot run (a CPU, a GPU older than it
    supports) falls back with a warning to what `auto` picks there; every backend finds the same path."""
    from ..model.triton_support import triton_problem

    if requested != "triton":
        return requested
    problem = "this run trains on the CPU" if device.type != "cuda" else triton_problem(device)
    if problem is None:
        return requested
    fallback = "torch" if device.type == "cuda" else "numba"
    log(f"warning: --mas_backend triton needs a CUDA GPU that Triton supports ({problem}); using {fallback}")
    return fallback


def idle_gpus_note(processes: int, visible_gpus: int, argv: list[str]) -> str | None:
    """The line for a single-process run that leaves GPUs idle (Kaggle gives two T4s): the command that
    trains on all of them. None when every visible GPU has a process (or there is one GPU)."""
    if processes != 1 or visible_gpus < 2:
        return None
    script = argv[0] if argv and argv[0].endswith(".py") else "train_vits.py"  # as the user ran it
    command = shlex.join(["accelerate", "launch", "--num_processes", str(visible_gpus), script, *argv[1:]])
    return (
        f"note: {visible_gpus} GPUs are visible and this run uses 1; to train on all of them, start it as "
        f"`{command}` (--batch_size is per GPU; docs/multi-gpu.md)"
    )


def make_accelerator(mixed_precision: str, cpu: bool, report_to: str, project_dir: Path):
    stray = stray_world_size()
    if stray is not None:  # accelerate would read it as a number: its traceback, not an error line
        raise UserError(
            f"WORLD_SIZE={stray!r} is not a number of processes (torchrun and accelerate launch set it "
            "themselves): unset it to train in one process"
        )
    from accelerate import Accelerator
    from accelerate.utils import GradScalerKwargs

    # the loss scaler starts at 1024: 65536 (the default) overflows for the first dozens of steps and
    # was seen driving losses to NaN
    handlers = [GradScalerKwargs(init_scale=1024.0, growth_interval=1000)]
    # no DistributedDataParallelKwargs(find_unused_parameters=True): DDP needs no search for unused
    # parameters, a layer the text encoder's layer drop skips still runs and gets a (zero) gradient
    # (model/text_encoder.py)
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
    if world_size() == 1:
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


LOG_FILE = "train.log"  # in the checkpoint folder: the run's lines, every session appended


class LogCopy:
    """The process's log lines, also appended to the run's LOG_FILE: a closed terminal or a lost notebook
    output keeps them. Lines logged before the run's folder is known (and set up without error: a
    refused run writes nothing) wait, and go in first. Each line is appended on its own, so a killed
    process loses none; a folder that cannot be written stops the copy with one warning."""

    PENDING = 2000  # lines kept before the file is known

    def __init__(self) -> None:
        self.path: Path | None = None
        self.pending: list[str] = []

    def add(self, message: str) -> None:
        if self.path is None:
            self.pending = [*self.pending[-(self.PENDING - 1) :], message]
        else:
            self._append([message])

    def reset(self) -> None:
        self.path, self.pending = None, []

    def to(self, path: Path | None) -> None:
        """Append from now on to `path` (the lines waiting go first); None: keep them waiting."""
        self.path = path
        if path is not None:
            lines, self.pending = self.pending, []
            self._append([f"---- {time.strftime('%Y-%m-%d %H:%M:%S')} pid {os.getpid()}", *lines])

    def _append(self, lines: list[str]) -> None:
        try:
            with open(self.path, "a", encoding="utf-8") as f:
                f.write("".join(f"{line}\n" for line in lines))
        except OSError as err:
            print(f"warning: the log is not kept in {self.path} ({err.strerror or err})", flush=True)
            self.path = None


class Logger:
    """Lines for the user from the main process only; plain print so tests and logs can read them, and
    a copy in the run's LOG_FILE (`Logger.copy`, one per process)."""

    copy = LogCopy()

    def __init__(self, enabled: bool = True):
        self.enabled = enabled
        self.bar = None  # a tqdm bar to print around, when one is active (print_around)

    def print_around(self, bar) -> None:
        """Print above `bar` from now on (the tqdm bar of reporting.Progress, while it is drawn), so a line
        does not break it; None: plain prints again."""
        self.bar = bar

    def __call__(self, message: str) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.write(message, file=sys.stdout)
        else:
            print(message, flush=True)
        Logger.copy.add(message)
