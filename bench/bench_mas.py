"""Benchmark monotonic alignment search backends (not a test).

    python bench/bench_mas.py [--batch 16] [--lengths 128 256 512] [--repeats 5]

Every item in a batch has the full text length and 4x as many frames (the worst case for the band-limited
numba path). Times are medians of --repeats runs after a warm-up call; the numba compile time is measured
separately in fresh subprocesses (cold compile, then loading the on-disk cache). The plain Python reference
runs once per length on the whole batch (--reference-items to use fewer items and scale up). Every backend's
path is checked against the reference. JSON goes to bench/results/mas.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numba  # noqa: E402
import torch  # noqa: E402

from vits_trainer.model.alignment import maximum_path, reference_maximum_path  # noqa: E402

# Run in a subprocess: import + first call on a tiny batch, so the time is dominated by compile / cache load.
_COMPILE_SNIPPET = """
import time, torch
from vits_trainer.model.alignment import maximum_path
ll = torch.zeros(2, 3, 7)
lengths = torch.tensor([3, 2]), torch.tensor([7, 5])
start = time.perf_counter()
maximum_path(ll, *lengths, backend="numba")
print(time.perf_counter() - start)
"""


def _no_sync() -> None:
    pass


def _median_seconds(fn: Callable[[], object], repeats: int, sync: Callable[[], None]) -> float:
    times = []
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _numba_first_call_seconds() -> dict[str, float]:
    with tempfile.TemporaryDirectory() as cache_dir:
        env = {**os.environ, "NUMBA_CACHE_DIR": cache_dir, "PYTHONPATH": str(ROOT)}
        cmd = [sys.executable, "-c", _COMPILE_SNIPPET]
        cold = float(subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout)
        cached = float(subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout)
    return {"cold_compile_s": cold, "cache_load_s": cached}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--lengths", type=int, nargs="+", default=[128, 256, 512])
    parser.add_argument("--frames-per-token", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--reference-items", type=int, default=0, help="items for the reference; 0 = batch")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "mas.json")
    args = parser.parse_args(argv)

    cuda = torch.cuda.is_available()
    ref_items = args.reference_items or args.batch
    compile_times = _numba_first_call_seconds()
    # One tiny call here so numba picks its threading layer before it is reported.
    maximum_path(torch.zeros(1, 1, 1), torch.tensor([1]), torch.tensor([1]), backend="numba")
    print(
        f"torch {torch.__version__} ({torch.get_num_threads()} threads), numba {numba.__version__} "
        f"({numba.get_num_threads()} threads, {numba.threading_layer()} layer), {os.cpu_count()} CPUs "
        f"({platform.machine()})" + (f", {torch.cuda.get_device_name()}" if cuda else ", no CUDA")
    )
    print(
        f"numba first call in a fresh process: cold compile {compile_times['cold_compile_s']:.2f} s, "
        f"from on-disk cache {compile_times['cache_load_s']:.2f} s (excluded from the timings below)"
    )
    scale_note = (
        ""
        if ref_items == args.batch
        else f" (timed on {ref_items} item(s), scaled x{args.batch / ref_items:g})"
    )
    print(
        f"batch {args.batch}, all items full length, median of {args.repeats} after a warm-up; "
        f"python reference: 1 run{scale_note}"
    )

    rows = []
    header = f"{'T_text':>6} {'T_frames':>8} {'reference':>11} {'numba':>9} {'torch cpu':>10}"
    header += f" {'torch cuda':>11} {'triton cuda':>12}" if cuda else ""
    print(header)
    gen = torch.Generator().manual_seed(0)
    for text_len in args.lengths:
        frames = args.frames_per_token * text_len
        ll = torch.randn(args.batch, text_len, frames, generator=gen) * 3 - 5
        text_lengths = torch.full((args.batch,), text_len)
        frame_lengths = torch.full((args.batch,), frames)

        start = time.perf_counter()
        expected = reference_maximum_path(ll[:ref_items], text_lengths[:ref_items], frame_lengths[:ref_items])
        reference_s = (time.perf_counter() - start) * args.batch / ref_items

        row = {"text_len": text_len, "frames": frames, "batch": args.batch, "reference_s": reference_s}
        inputs = (ll, text_lengths, frame_lengths)
        runs = [("numba_s", "numba", inputs), ("torch_cpu_s", "torch", inputs)]
        if cuda:
            on_gpu = tuple(t.cuda() for t in inputs)
            runs += [("torch_cuda_s", "torch", on_gpu), ("triton_cuda_s", "triton", on_gpu)]
        for key, backend, (ll_x, tx_x, ty_x) in runs:
            sync = torch.cuda.synchronize if ll_x.is_cuda else _no_sync
            got = maximum_path(
                ll_x, tx_x, ty_x, backend=backend
            )  # warm-up, and a check against the reference
            if not torch.equal(got[:ref_items].cpu(), expected):
                raise SystemExit(f"{key} disagrees with the reference at T_text={text_len}")
            row[key] = _median_seconds(
                partial(maximum_path, ll_x, tx_x, ty_x, backend=backend), args.repeats, sync
            )
        rows.append(row)
        line = f"{text_len:>6} {frames:>8} {reference_s * 1e3:>9.0f}ms {row['numba_s'] * 1e3:>7.1f}ms"
        line += f" {row['torch_cpu_s'] * 1e3:>8.1f}ms"
        line += f" {row['torch_cuda_s'] * 1e3:>9.1f}ms {row['triton_cuda_s'] * 1e3:>10.2f}ms" if cuda else ""
        print(line, flush=True)

    args.out.parent.mkdir(parents=True, exist_ok=True)
    result = {
        "torch": torch.__version__,
        "numba": numba.__version__,
        "torch_threads": torch.get_num_threads(),
        "numba_threads": numba.get_num_threads(),
        "numba_threading_layer": numba.threading_layer(),
        "cpu_count": os.cpu_count(),
        "cuda_device": torch.cuda.get_device_name() if cuda else None,
        "repeats": args.repeats,
        "reference_items": ref_items,
        "reference_note": "one run; scaled to the batch"
        if ref_items != args.batch
        else "one run on the batch",
        "numba_first_call": compile_times,
        "rows": rows,
    }
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out.relative_to(ROOT) if args.out.is_relative_to(ROOT) else args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
