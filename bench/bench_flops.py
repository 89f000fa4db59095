"""The arithmetic of one training sample, counted: what the GPU ceiling in docs/performance.md rests on
(not a test).

    python bench/bench_flops.py [--models mms] [--batch_size 8] [--peak_tflops 989]

One micro-step of the trainer's `GanStep` (a whole optimiser step) on `--batch_size` generated clips of
~3 s, set up as bench/bench_step.py does it (`build_session`, length-bucketed batches from the sampler),
runs under `torch.utils.flop_counter.FlopCounterMode`, which counts the floating-point operations of
every matrix product and convolution (forward, and each gradient the backward computes: none for a
frozen weight) from the operators' shapes. Elementwise operators, norms and the STFT's FFTs are not
counted: next to the convolutions they are a few percent of the arithmetic, and limited by memory,
not by the tensor cores the peak rate is for. The count does not depend on the device or precision;
it runs on the CPU in fp32.

Split by region: each network's forward (the generator's parts, the discriminator's two passes), and
the two backward passes (the discriminator's loss, then the generator's through the discriminator).
Printed: GFLOP per clip by section, in all, and the clips' mean length; then the arithmetic ceiling:
`--peak_tflops` (dense bf16 tensor-core TFLOP/s: 989 for an H100 SXM and an H200, NVIDIA's data
sheets) over the FLOP per clip, the samples/s a GPU computing at its peak all the time would train.
JSON to bench/results/flops.json.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from torch.utils.flop_counter import FlopCounterMode, conv_backward_flop  # noqa: E402

# torch's formula on shapes (the registered one takes tensors and wraps this)
_CONV_BACKWARD_ON_SHAPES = getattr(conv_backward_flop, "__wrapped__", conv_backward_flop)

from bench.bench_ops import GENERATOR_PARTS, label_modules  # noqa: E402
from bench.bench_step import (  # noqa: E402
    CORPUS_WORDS,
    batches_of,
    make_model_dir,
    quiet_session,
    train_config,
)
from vits_trainer.data.loader import ClipDataset, collate_batch  # noqa: E402
from vits_trainer.data.synthetic import make_corpus  # noqa: E402
from vits_trainer.training.loop import gan_step  # noqa: E402
from vits_trainer.training.runtime import quiet_transformers  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "flops.json"
PEAK_TFLOPS = 989.0  # H100 SXM and H200: dense bf16 on the tensor cores
# counted by this script (`--models mms --batch_size 8`: 2.66 s clips): an MMS-size training sample
GFLOP_PER_CLIP = 157.8
# the samples/s of an H100 or H200 computing at its peak all the time: the share benchmarks report
CEILING_SAMPLES_PER_SECOND = PEAK_TFLOPS * 1e3 / GFLOP_PER_CLIP


def grouped_conv_backward_flop(*args, out_shape=None, **kwargs) -> int:
    """torch's count of a convolution's backward with the weight gradient of a grouped convolution
    divided by its groups: torch's formula leaves the groups out of that part (its own comment says it
    skips them), which counts the scale discriminator's grouped layers' weight gradients up to 256
    times (12 GFLOP of 171 per clip at MMS size). Takes `aten.convolution_backward`'s arguments as
    torch's formula does (shapes for tensors): ..., groups (10th), output_mask (11th)."""
    groups, wanted = args[9], list(args[10])  # output_mask: grad_input, grad_weight, grad_bias
    count = 0
    for part, share in ((0, 1), (1, groups)):  # the bias's gradient is a sum: no products counted
        if wanted[part]:
            mask = [i == part for i in range(len(wanted))]
            count += (
                _CONV_BACKWARD_ON_SHAPES(*args[:10], mask, *args[11:], out_shape=out_shape, **kwargs) // share
            )
    return count


class FlopSections:
    """FLOPs counted inside regions of the step: each network's forward (`region`, opened by hooks
    around the modules' forward), and each backward pass. For the backward passes it stands in for the
    step's section timer (profiling.SectionTimer's interface): the step runs "backward" twice, the
    discriminator's loss first (gradients of its weights), then the generator's (through the
    discriminator to the generator's)."""

    BACKWARDS = ("backward: the discriminator's loss", "backward: the generator's loss")

    def __init__(self, counter: FlopCounterMode):
        self.counter = counter
        self.flops: collections.Counter = collections.Counter()
        self.backwards = 0

    @contextlib.contextmanager
    def region(self, name: str):
        before = self.counter.get_total_flops()
        try:
            yield
        finally:
            self.flops[name] += self.counter.get_total_flops() - before

    def __call__(self, name: str):
        if name != "backward":  # the forward's sections: counted by module instead
            return contextlib.nullcontext()
        label = self.BACKWARDS[min(self.backwards, 1)]
        self.backwards += 1
        return self.region(label)


def count_step(kind: str, batch_size: int, tmp: Path, data_dir: Path) -> dict:
    model_dir = make_model_dir(kind, tmp / f"model-{kind}")
    cfg = train_config(tmp / f"run-{kind}", data_dir, model_dir, kind, batch_size, "cpu", "no")
    session = quiet_session(cfg)
    step = gan_step(session)
    dataset = ClipDataset(session.data.train)
    batch = collate_batch([dataset[j] for j in batches_of(session)[0]], session.pad)
    clips = batch.pop("indices").numel()
    batch.pop("text_lengths")
    seconds = batch["audio_lengths"].float().mean().item() / session.model.config.sampling_rate
    counter = FlopCounterMode(
        display=False, custom_mapping={torch.ops.aten.convolution_backward: grouped_conv_backward_flop}
    )
    sections = FlopSections(counter)
    step.timer = sections
    model = session.generator_raw.model
    parts = {f"forward: {name}": getattr(model, name) for name in GENERATOR_PARTS if hasattr(model, name)}
    parts["forward: discriminator (both passes)"] = session.discriminator_raw
    handles = label_modules(parts, sections.region)
    torch.manual_seed(1)
    try:
        with counter:
            result = step(batch, 0, 1)
    finally:
        for handle in handles:
            handle.remove()
    if not result.synced or result.skipped:
        raise RuntimeError(f"{kind}: the counted step did not update the networks")
    total = counter.get_total_flops()
    by_section = dict(sections.flops)
    # the rest: the alignment search's and the losses' products, the prior's expansion to frames
    by_section["other"] = total - sum(by_section.values())
    by_op = collections.Counter()
    for op, flops in counter.get_flop_counts().get("Global", {}).items():
        by_op[str(op).split(".")[-1]] += flops
    return {
        "model": kind,
        "batch_size": clips,
        "clip_seconds": seconds,
        "tokens": int(batch["input_ids"].shape[-1]),
        "gflop_per_clip": total / clips / 1e9,
        "gflop_per_clip_by_section": {k: v / clips / 1e9 for k, v in by_section.items()},
        "gflop_per_clip_by_op": {k: v / clips / 1e9 for k, v in by_op.most_common()},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="mms", help="comma-separated: tiny, mms")
    parser.add_argument("--batch_size", type=int, default=8)
    parser.add_argument("--peak_tflops", type=float, default=PEAK_TFLOPS, help="the GPU's dense bf16 rate")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    quiet_transformers()
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench_flops-") as tmp_name:
        tmp = Path(tmp_name)
        data_dir = tmp / "data"
        make_corpus(data_dir, num_clips=24, seed=0, min_words=CORPUS_WORDS[0], max_words=CORPUS_WORDS[1])
        for kind in args.models.split(","):
            row = count_step(kind, args.batch_size, tmp, data_dir)
            row["peak_tflops"] = args.peak_tflops
            row["ceiling_samples_per_second"] = args.peak_tflops * 1e3 / row["gflop_per_clip"]
            rows.append(row)
            print(
                f"{kind}, batch {row['batch_size']} of {row['clip_seconds']:.2f} s clips "
                f"({row['tokens']} tokens padded): {row['gflop_per_clip']:.1f} GFLOP per clip; at "
                f"{args.peak_tflops:g} TFLOP/s {row['ceiling_samples_per_second']:,.0f} samples/s"
            )
            for name, gflop in sorted(row["gflop_per_clip_by_section"].items(), key=lambda kv: -kv[1]):
                print(f"  {gflop:7.1f} GFLOP  {100 * gflop / row['gflop_per_clip']:4.1f} %  {name}")
            ops = ", ".join(f"{k} {v:.1f}" for k, v in row["gflop_per_clip_by_op"].items())
            print(f"  by operator: {ops}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    command = "python bench/bench_flops.py " + " ".join(argv if argv is not None else sys.argv[1:])
    args.out.write_text(json.dumps({"command": command, "rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
