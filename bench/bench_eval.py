"""What one evaluation costs with the free-running scores and pictures, against the evaluation before
them (not a test).

    python bench/bench_eval.py [--repeats 7] [--freerun_samples 8] [--eval_samples 3] [--model DIR]

On the demo's tone-language corpus (160 clips, 16 held out) and a tiny model (--model: a trained one,
e.g. training/demo/final_model, whose speech has realistic durations; default a fresh one), CPU, one
thread. Per round, interleaved
so a busy machine slows both alike: the old evaluation (teacher-forced validation + --eval_samples WAVs
synthesised) and the new one (teacher-forced validation + --freerun_samples sentences spoken and scored,
their WAVs reused, alignment search + PNGs for --eval_samples). Medians of wall and CPU seconds (CPU
time is less disturbed by other processes on a shared machine) and their ratios; JSON to
bench/results/eval.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from vits_trainer.data.synthetic import make_corpus  # noqa: E402
from vits_trainer.model.tiny import make_tiny_model  # noqa: E402
from vits_trainer.training.config import TrainConfig  # noqa: E402
from vits_trainer.training.evaluate import evaluate, synthesize  # noqa: E402
from vits_trainer.training.freerun import free_running_eval, write_wavs  # noqa: E402
from vits_trainer.training.pictures import alignment_paths, write_pictures  # noqa: E402
from vits_trainer.training.session import build_session  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--freerun_samples", type=int, default=8)
    parser.add_argument("--eval_samples", type=int, default=3)
    parser.add_argument("--model", default="", help="a trained model folder (default: a fresh tiny model)")
    args = parser.parse_args()
    torch.set_num_threads(1)  # the machine is shared; one thread keeps the comparison fair
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        make_corpus(tmp / "data", num_clips=160, sample_rate=16000, seed=0)
        model_dir = args.model or str(make_tiny_model(tmp / "model"))
        cfg = dataclasses.replace(
            TrainConfig(),
            data_dir=str(tmp / "data"),
            model_name=model_dir,
            checkpoint_dir=str(tmp / "ckpt"),
            output_dir=str(tmp / "out"),
            val_fraction=0.1,
            num_workers=0,
            batch_size=8,
            cpu=True,
            discriminator_width=0.125,
            freerun_samples=args.freerun_samples,
            eval_samples=args.eval_samples,
        )
        s = build_session(cfg, time.time())
        items = next(iter(s.data.val_sets.values()))
        weights = cfg.loss_weights()

        def teacher_forced():
            for loader in s.val_loaders.values():
                evaluate(s.generator_raw, loader, s.device, s.accelerator.autocast, weights=weights)

        def old(folder: Path):
            teacher_forced()
            n = min(args.eval_samples, len(items))
            sentences = [(items.clip_id(k), items.text(k), int(items.speaker_ids[k])) for k in range(n)]
            synthesize(s.model, s.text, sentences, folder, s.device)

        def new(folder: Path):
            teacher_forced()
            _, spoken = free_running_eval(s)
            n = min(args.eval_samples, len(items))
            write_wavs(spoken[:n], folder, s.model.config.sampling_rate)
            paths = alignment_paths(s.generator_raw, items, n, s.device)
            write_pictures(folder, [items.clip_id(k) for k in range(n)], paths, spoken[:n])

        old(tmp / "warm_old")
        new(tmp / "warm_new")
        times = {"old": [], "new": []}
        cpu = {"old": [], "new": []}
        for r in range(args.repeats):
            for name, fn in (("old", old), ("new", new)) if r % 2 == 0 else (("new", new), ("old", old)):
                t0, c0 = time.perf_counter(), time.process_time()
                fn(tmp / f"{name}{r}")
                times[name].append(time.perf_counter() - t0)
                cpu[name].append(time.process_time() - c0)
        result = {
            "model": args.model or "fresh tiny model",
            "val_clips": len(items),
            "freerun_samples": min(args.freerun_samples, len(items)),
            "eval_samples": args.eval_samples,
            "old_median_s": statistics.median(times["old"]),
            "new_median_s": statistics.median(times["new"]),
            "ratios": [n / o for n, o in zip(times["new"], times["old"], strict=True)],
            "old_median_cpu_s": statistics.median(cpu["old"]),
            "new_median_cpu_s": statistics.median(cpu["new"]),
        }
        result["ratio_of_medians"] = result["new_median_s"] / result["old_median_s"]
        result["cpu_ratio_of_medians"] = result["new_median_cpu_s"] / result["old_median_cpu_s"]
        print(json.dumps(result, indent=1))
        out = ROOT / "bench" / "results"
        out.mkdir(parents=True, exist_ok=True)
        (out / "eval.json").write_text(json.dumps(result, indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()
