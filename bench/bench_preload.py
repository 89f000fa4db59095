"""Benchmark the clip preloader: cold load (builds the cache), warm loads (cache hit), RAM per hour.

    python bench/bench_preload.py --clips 2000 20000

For each size it writes N clips of 3 s at 16 kHz (a few distinct tone waveforms, copied, so
generating 20k clips takes seconds), then times each load in a fresh subprocess so the RSS growth
is the loader's own. File pages are dropped from the OS page cache first (posix_fadvise on our own
files only), so "cold" really reads the disk. Writes bench/results/preload.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from vits_trainer.data.metadata import MetaRow, write_metadata  # noqa: E402
from vits_trainer.data.prepare_state import mark_as_made  # noqa: E402
from vits_trainer.data.synthetic import ALPHABET, random_sentence  # noqa: E402

DISTINCT_WAVEFORMS = 16


def make_data(out: Path, num_clips: int, seconds: float, sample_rate: int) -> float:
    """Write `num_clips` wavs + metadata.csv into `out`; returns the seconds it took."""
    import soundfile as sf

    t0 = time.perf_counter()
    wavs = out / "wavs"
    wavs.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    n = int(seconds * sample_rate)
    t = np.arange(n) / sample_rate
    templates = []
    for k in range(DISTINCT_WAVEFORMS):
        f0 = 110.0 * 2 ** (k / 6)
        audio = 0.3 * np.sin(2 * np.pi * f0 * t) * (0.6 + 0.4 * np.sin(2 * np.pi * 3 * t))
        audio += 0.003 * rng.standard_normal(n)
        path = out / f"template{k}.wav"
        sf.write(path, audio.astype(np.float32), sample_rate, subtype="PCM_16")
        templates.append(path)
    rows = []
    for i in range(num_clips):
        clip_id = f"utt{i:06d}"
        shutil.copyfile(templates[i % DISTINCT_WAVEFORMS], wavs / f"{clip_id}.wav")
        rows.append(MetaRow(clip_id, random_sentence(rng, ALPHABET), "0"))
    write_metadata(out / "metadata.csv", rows)
    mark_as_made(out, "bench_preload")  # a corpus of ours, as prepare_data.py's: it gets the cache timed here
    return time.perf_counter() - t0


def drop_page_cache(paths: list[Path]) -> None:
    """Evict these files' pages (only ours, nothing system-wide) so the next read hits the disk."""
    if not hasattr(os, "posix_fadvise"):
        return
    os.sync()  # dirty pages cannot be dropped
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def child(data_dir: Path, sample_rate: int, max_ram_gb: float, loader_epoch: bool) -> dict:
    """One load in this (fresh) process; prints nothing but the JSON result."""
    import psutil

    from vits_trainer.data.clipstore import load_clip_store
    from vits_trainer.data.items import build_items
    from vits_trainer.data.loader import make_loader
    from vits_trainer.data.sampler import BucketBatchSampler

    proc = psutil.Process()
    rss0 = proc.memory_info().rss
    store, report = load_clip_store(
        data_dir, sample_rate, max_ram_gb=max_ram_gb, log=lambda m: None, progress=False
    )
    result = {
        "report": report.to_dict(),
        "rss_growth_bytes": proc.memory_info().rss - rss0,
        "array_bytes": int(store.audio.nbytes),
    }
    if loader_epoch:
        # One epoch through the real loader path (no GPU): the samples/s the trainer can be fed at.
        items, _ = build_items(
            store, range(len(store)), lambda s: [1] * len(s), {"0": 0}, hop_length=256, log=lambda m: None
        )
        sampler = BucketBatchSampler(items.audio_lengths(), batch_size=32, seed=0)
        t0 = time.perf_counter()
        n = sum(
            len(batch["indices"]) for batch in make_loader(items, sampler, num_workers=0, pin_memory=False)
        )
        result["loader_samples_per_s"] = n / (time.perf_counter() - t0)
    return result


def run_child(data_dir: Path, sample_rate: int, max_ram_gb: float, loader_epoch: bool = False) -> dict:
    cmd = [sys.executable, __file__, "--child", str(data_dir), "--sample-rate", str(sample_rate)]
    cmd += ["--max-ram-gb", str(max_ram_gb)] + (["--loader-epoch"] if loader_epoch else [])
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def bench_size(num_clips: int, args: argparse.Namespace, base: Path) -> dict:
    data = base / f"clips{num_clips}"
    print(f"\n== {num_clips} clips: writing data to {data} ...", flush=True)
    gen_s = make_data(data, num_clips, args.seconds, args.sample_rate)
    wav_paths = sorted((data / "wavs").iterdir())
    print(f"   generated in {gen_s:.1f} s", flush=True)

    drop_page_cache(wav_paths)
    cold = run_child(data, args.sample_rate, 0.0)
    bin_path = data / "cache" / "audio_int16.bin"
    warm = run_child(data, args.sample_rate, 0.0, loader_epoch=True)  # bin still in the page cache
    drop_page_cache([bin_path])
    warm_disk = run_child(data, args.sample_rate, 0.0)  # bin read from disk
    mapped = run_child(data, args.sample_rate, 1e-6)  # forced memory map

    assert (
        not cold["report"]["cache_hit"] and warm["report"]["cache_hit"] and warm_disk["report"]["cache_hit"]
    )
    hours = warm["report"]["hours"]
    return {
        "clips": num_clips,
        "hours": hours,
        "generate_s": gen_s,
        "cold_build_s": cold["report"]["seconds"],
        "cold_timings": cold["report"]["timings"],
        "warm_hit_s": warm["report"]["seconds"],
        "warm_hit_disk_s": warm_disk["report"]["seconds"],
        "warm_hit_timings": warm["report"]["timings"],
        "memmap_hit_s": mapped["report"]["seconds"],
        "array_bytes": warm["array_bytes"],
        "array_bytes_per_hour": warm["array_bytes"] / hours,
        "rss_growth_cold_bytes": cold["rss_growth_bytes"],
        "rss_growth_warm_bytes": warm["rss_growth_bytes"],
        "rss_growth_memmap_bytes": mapped["rss_growth_bytes"],
        "rss_growth_warm_per_hour": warm["rss_growth_bytes"] / hours,
        "loader_samples_per_s": warm["loader_samples_per_s"],
        "in_ram": warm["report"]["in_ram"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clips", type=int, nargs="+", default=[2000, 20000])
    parser.add_argument("--seconds", type=float, default=3.0, help="length of each clip")
    parser.add_argument("--sample-rate", type=int, default=16000)
    parser.add_argument("--keep", action="store_true", help="keep the generated data (path is printed)")
    parser.add_argument(
        "--workdir", type=Path, default=None, help="where to write the data (default: a temp dir)"
    )
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--max-ram-gb", type=float, default=0.0, help=argparse.SUPPRESS)
    parser.add_argument("--loader-epoch", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.child:
        print(json.dumps(child(args.child, args.sample_rate, args.max_ram_gb, args.loader_epoch)))
        return

    base = Path(tempfile.mkdtemp(prefix="bench_preload_", dir=args.workdir))
    results = []
    try:
        for n in args.clips:
            results.append(bench_size(n, args, base))
            if not args.keep:
                shutil.rmtree(base / f"clips{n}")
    finally:
        if args.keep:
            print(f"data kept in {base}")
        else:
            shutil.rmtree(base, ignore_errors=True)

    mb = 2**20
    header = (
        f"{'clips':>7} {'hours':>6} {'cold s':>7} {'warm s':>7} {'warm(disk) s':>12} {'mmap s':>7} "
        f"{'MB/hour':>8} {'RSS MB/hour':>11} {'RSS MB':>7} {'loader smp/s':>12}"
    )
    print("\n" + header)
    for r in results:
        print(
            f"{r['clips']:>7} {r['hours']:>6.2f} {r['cold_build_s']:>7.2f} {r['warm_hit_s']:>7.2f} "
            f"{r['warm_hit_disk_s']:>12.2f} {r['memmap_hit_s']:>7.2f} {r['array_bytes_per_hour'] / mb:>8.1f} "
            f"{r['rss_growth_warm_per_hour'] / mb:>11.1f} {r['rss_growth_warm_bytes'] / mb:>7.0f} "
            f"{r['loader_samples_per_s']:>12.0f}"
        )
    out = ROOT / "bench" / "results" / "preload.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"python": platform.python_version(), "cpus": os.cpu_count(), "seconds_per_clip": args.seconds}
    out.write_text(json.dumps({"machine": meta, "results": results}, indent=2))
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
