"""What --freeze and --gradient_checkpointing save: step time and peak memory, each in a fresh process.

    python bench/bench_knobs.py --model mms --batch_size 8 --steps 4

Each configuration runs the real Trainer (no evaluation) in its own subprocess so the peak memory is its
own: peak RSS on CPU (ru_maxrss: weights, optimiser state and activations), peak allocated CUDA memory on
a GPU. Writes bench/results/knobs.json.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CONFIGS = {
    "baseline": {},
    "freeze text_encoder,duration_predictor": {"freeze": "text_encoder,duration_predictor"},
    "freeze posterior_encoder,flow": {"freeze": "posterior_encoder,flow"},
    "freeze decoder": {"freeze": "decoder"},
    "gradient_checkpointing": {"gradient_checkpointing": True},
}


def one(model_kind: str, batch: int, steps: int, settings: dict) -> dict:
    import time

    import torch

    from bench.bench_train import corpus, make_model, run_config
    from vits_trainer.training.loop import Trainer
    from vits_trainer.training.session import build_session

    tmp = Path(tempfile.mkdtemp())
    data = corpus(tmp, 64)
    model, width = make_model(model_kind, tmp / model_kind)
    cfg = run_config(
        tmp,
        data,
        model,
        width,
        steps,
        batch_size=batch,
        gradient_accumulation_steps=1,
        warmup_steps=0,
        benchmark_samples=batch * 2,
        num_workers=0,
        target_hours=10,
        **settings,
    )
    session = build_session(cfg, time.time())
    trainable = sum(p.numel() for p in session.model.parameters() if p.requires_grad)
    summary = Trainer(session).train()
    peak_cuda = torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None
    return {
        "step_seconds": session.budget.average_step_seconds(),
        "samples_per_second": summary["samples_per_second"],
        "trainable_generator_m": trainable / 1e6,
        "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
        "peak_cuda_gb": peak_cuda,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="mms", choices=["tiny", "mms"])
    parser.add_argument("--batch_size", type=int, default=8)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)  # internal: run one configuration
    args = parser.parse_args()
    if args.one is not None:
        print("RESULT " + json.dumps(one(args.model, args.batch_size, args.steps, CONFIGS[args.one])))
        return
    rows = []
    for name in CONFIGS:
        cmd = [
            sys.executable,
            __file__,
            "--model",
            args.model,
            "--batch_size",
            str(args.batch_size),
            "--steps",
            str(args.steps),
            "--one",
            name,
        ]
        out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
        line = next((x for x in out.stdout.splitlines() if x.startswith("RESULT ")), None)
        if line is None:
            print(out.stdout[-2000:], out.stderr[-2000:])
            raise SystemExit(f"{name} failed")
        row = {"config": name, "model": args.model, "batch_size": args.batch_size, **json.loads(line[7:])}
        print(json.dumps(row), flush=True)
        rows.append(row)
    base = rows[0]
    for row in rows:
        row["time_vs_baseline"] = row["step_seconds"] / base["step_seconds"]
        row["rss_vs_baseline"] = row["peak_rss_gb"] / base["peak_rss_gb"]
    out_dir = ROOT / "bench" / "results"
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "knobs.json").write_text(json.dumps({"command": " ".join(sys.argv), "rows": rows}, indent=1))
    for row in rows:
        print(
            f"{row['config']:40s} step {row['step_seconds']:.2f} s (x{row['time_vs_baseline']:.2f})  "
            f"peak RSS {row['peak_rss_gb']:.2f} GB (x{row['rss_vs_baseline']:.2f})  "
            f"trainable G {row['trainable_generator_m']:.1f} M"
        )


if __name__ == "__main__":
    main()
