"""The first thing to run on a borrowed GPU machine: each import and the first CUDA work, one line each
with the seconds it took, flushed as it goes. A machine where one of them hangs then shows which,
before any benchmark has spent the lease (bench/gpu_check.sh runs it as its first stage).

    python bench/gpu_probe.py [--seconds 120]

Exit status 0 when every step ran, 1 when one failed; after --seconds, every thread's stack is
printed and the process exits (faulthandler), so a hang inside torch or the driver names its place."""

from __future__ import annotations

import argparse
import faulthandler
import importlib
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _cuda_work() -> str:
    import torch

    x = torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16)
    (x @ x).float().sum().item()  # a kernel launched and its result read back
    return (
        f"{torch.cuda.get_device_name()}, {torch.cuda.get_device_properties(0).total_memory / 2**30:.0f} GiB"
    )


def _versions() -> str:
    import torch

    return f"torch {torch.__version__}, CUDA {torch.version.cuda}, available {torch.cuda.is_available()}"


STEPS = [
    ("import torch", lambda: importlib.import_module("torch") and ""),
    ("versions", _versions),
    ("first CUDA work", _cuda_work),
    ("import transformers", lambda: importlib.import_module("transformers").__version__),
    ("import accelerate", lambda: importlib.import_module("accelerate").__version__),
    ("import soundfile", lambda: importlib.import_module("soundfile").__version__),
    ("import librosa", lambda: importlib.import_module("librosa").__version__),
    ("import numba", lambda: importlib.import_module("numba").__version__),
    ("import vits_trainer", lambda: importlib.import_module("vits_trainer.training.loop") and ""),
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=120.0, help="dump every stack and exit after this")
    args = parser.parse_args()
    faulthandler.dump_traceback_later(args.seconds, exit=True)
    for name, step in STEPS:
        print(f"{name} ...", end=" ", flush=True)
        start = time.monotonic()
        try:
            said = step()
        except Exception as exc:  # noqa: BLE001 - the probe reports any failure and stops
            print(f"FAILED after {time.monotonic() - start:.1f} s: {type(exc).__name__}: {exc}", flush=True)
            return 1
        print(f"{time.monotonic() - start:.1f} s {said or ''}".rstrip(), flush=True)
    faulthandler.cancel_dump_traceback_later()
    return 0


if __name__ == "__main__":
    sys.exit(main())
