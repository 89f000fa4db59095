"""What padding batches to bucket edges costs, and how many shapes a run meets (not a test).

    python bench/bench_shapes.py [--clips 13100] [--batch_sizes 8,16,32] [--epochs 3]

Lengths only, no audio: a corpus shaped like LJSpeech (13,100 clips, 1-10 s, ~6.6 s on average, about
15 characters a second, MMS's blank between characters: 2n+1 tokens) goes through the trainer's
`BucketBatchSampler` for --epochs epochs; each batch is padded as the loader pads it, to its longest
clip (`--length_buckets off`), to the bucket edges each length on its own (`edges`, how `on` padded
before token widths followed frame widths) or as `on` pads (data/shapes.py: the token width tied to the
frame edge). Printed per batch size:
- padding: padded frames (tokens) over real ones, minus 1: the extra work of the frame-length
  (text-length) parts of the step, i.e. the encoders and the flow; the decoder and discriminator run
  on fixed segments and do not see it;
- shapes: distinct (batch, tokens, frames) shapes over the run: each new one costs host time on a GPU
  (cuDNN's algorithm choice, the allocator; a compile, for compiled parts).
JSON goes to bench/results/shapes.json.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from vits_trainer.data.sampler import BucketBatchSampler  # noqa: E402
from vits_trainer.data.shapes import PadLengths, padded_widths  # noqa: E402

SAMPLE_RATE, HOP = 16000, 256


def ljspeech_like(clips: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(tokens, samples) per clip: durations ~ N(6.6 s, 2.2 s) within [1, 10.1] s, ~15 characters a
    second with some spread, 2n+1 tokens (a blank around every character)."""
    rng = np.random.default_rng(seed)
    seconds = np.clip(rng.normal(6.6, 2.2, clips), 1.0, 10.1)
    chars = np.maximum(1, np.round(seconds * 15.0 * rng.lognormal(0.0, 0.12, clips))).astype(np.int64)
    return 2 * chars + 1, np.round(seconds * SAMPLE_RATE).astype(np.int64)


def measure(tokens, samples, batch_size: int, epochs: int, pad: PadLengths | None) -> dict:
    sampler = BucketBatchSampler(samples, batch_size, shuffle=True, seed=0)
    real_frames = padded_frames = real_tokens = padded_tokens = 0
    shapes = set()
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for batch in sampler:
            t, s = tokens[batch], samples[batch]
            width_t, width_s = padded_widths(pad, int(t.max()), int(s.max()))
            real_frames += int((s // HOP).sum())
            padded_frames += len(batch) * (width_s // HOP)
            real_tokens += int(t.sum())
            padded_tokens += len(batch) * width_t
            shapes.add((len(batch), width_t, width_s // HOP))
    return {
        "frame_padding": padded_frames / real_frames - 1.0,
        "token_padding": padded_tokens / real_tokens - 1.0,
        "shapes": len(shapes),
        "batches": len(sampler) * epochs,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clips", type=int, default=13100)
    parser.add_argument("--batch_sizes", default="8,16,32")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "shapes.json")
    args = parser.parse_args(argv)
    tokens, samples = ljspeech_like(args.clips)
    rows = []
    print(f"{args.clips} clips, {samples.sum() / SAMPLE_RATE / 3600:.1f} h, {args.epochs} epochs")
    print("batch | buckets | frame padding | token padding | distinct shapes / batches")
    for b in (int(x) for x in args.batch_sizes.split(",")):
        tied = PadLengths.for_items(HOP, tokens, samples)
        for name, pad in (("off", None), ("edges", PadLengths(HOP)), ("on", tied)):
            row = {"batch_size": b, "length_buckets": name, **measure(tokens, samples, b, args.epochs, pad)}
            rows.append(row)
            print(
                f"{b} | {name} | {row['frame_padding']:.1%} | {row['token_padding']:.1%} | "
                f"{row['shapes']} / {row['batches']}"
            )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps({"clips": args.clips, "epochs": args.epochs, "rows": rows}, indent=2) + "\n"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
