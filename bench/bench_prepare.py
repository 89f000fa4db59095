"""Benchmark prepare_data: N generated clips (LJSpeech layout) at one rate, converted to another.

    python bench/bench_prepare.py                      # 1000 x 3 s at 22.05 kHz -> 16 kHz, all cores
    python bench/bench_prepare.py --clips 200 --num_workers 1

Prints seconds and clips/s for a fresh run and for a re-run (every WAV reused), and writes
bench/results/prepare.json. Clip generation is not timed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import soundfile as sf

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from vits_trainer.data.prepare import prepare  # noqa: E402
from vits_trainer.data.prepare_settings import PrepareSettings, default_workers  # noqa: E402
from vits_trainer.data.synthetic import random_sentence, synth_text  # noqa: E402


def make_clips(root: Path, clips: int, seconds: float, rate: int) -> None:
    """`clips` tone-language clips of exactly `seconds` each, as wavs/ + metadata.csv (16-bit PCM)."""
    (root / "wavs").mkdir(parents=True)
    rng = np.random.default_rng(0)
    n = int(seconds * rate)
    lines = []
    for i in range(clips):
        text = random_sentence(rng, min_words=8, max_words=12)
        audio = synth_text(text, rate, speaker=i % 4, seed=i)
        audio = np.resize(audio, n)  # repeat or cut to the exact length
        sf.write(root / "wavs" / f"clip{i:05d}.wav", audio, rate, subtype="PCM_16")
        lines.append(f"clip{i:05d}|{text}")
    (root / "metadata.csv").write_text("\n".join(lines) + "\n", encoding="utf-8")


def timed_run(settings: PrepareSettings) -> tuple[float, dict]:
    start = time.perf_counter()
    result = prepare(settings, log=lambda _line: None)
    return time.perf_counter() - start, result.report["counts"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clips", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--source_rate", type=int, default=22050)
    parser.add_argument("--sample_rate", type=int, default=16000)
    parser.add_argument("--num_workers", type=int, default=default_workers())
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "prepare.json")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        src, data_dir = Path(tmp) / "src", Path(tmp) / "training"
        make_clips(src, args.clips, args.seconds, args.source_rate)
        settings = PrepareSettings(
            source=str(src),
            data_dir=data_dir,
            sample_rate=args.sample_rate,
            num_workers=args.num_workers,
            progress=False,
        )
        fresh, counts = timed_run(settings)
        rerun, rerun_counts = timed_run(settings)
    assert counts["kept"] == args.clips and rerun_counts["reused"] == args.clips, (counts, rerun_counts)

    result = {
        "clips": args.clips,
        "clip_seconds": args.seconds,
        "source_rate": args.source_rate,
        "sample_rate": args.sample_rate,
        "num_workers": args.num_workers,
        "cpu_count": os.cpu_count(),
        "fresh_seconds": round(fresh, 3),
        "fresh_clips_per_second": round(args.clips / fresh, 1),
        "audio_seconds_per_second": round(args.clips * args.seconds / fresh, 1),
        "rerun_seconds": round(rerun, 3),
        "rerun_clips_per_second": round(args.clips / rerun, 1),
        "python": platform.python_version(),
        "machine": platform.machine(),
    }
    print(
        f"prepared {args.clips} x {args.seconds:g} s clips, {args.source_rate} -> {args.sample_rate} Hz, "
        f"{args.num_workers} worker(s): {fresh:.2f} s ({result['fresh_clips_per_second']} clips/s); "
        f"re-run reusing every WAV: {rerun:.2f} s"
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
