"""The compiled step against the eager one: compilation time, step time, the losses (not a test).

    python bench/bench_compile.py --device cuda --models mms --batch_sizes 16,32 --precision bf16
    python bench/bench_compile.py --models tiny --batch_sizes 8 --steps 4 --backend aot_eager

Each (model, batch size) is set up as train_vits.py does it (`build_session`, ~3 s tone-language
clips, the model made as in bench_step.py), once eager and once per compiled scope, from the same
seed: one session runs the trainer's `GanStep` eager, the others with `use_compiled(True)` and the
scope's parts (`--scopes`, model/compiled.py):
- segments: the decoder on segments and both discriminator passes (CUDA graphs on a GPU);
- fused: those, and the text encoder, posterior encoder, flow and duration predictor compiled with
  dynamic lengths, fused kernels without CUDA graphs (the trainer measures fused, then segments, and
  keeps the faster);
- graphs: as fused, with a CUDA graph per shape for those four too.
Each row also gives the compilations on new lengths per utterance part and the parts that went back
to eager for them.
All see the same length-bucketed batches (`--length_buckets`, on by default as on CUDA) in the same
order, one optimiser step per call.

- compile: the first --compile_steps compiled steps (compilation, graph recording) minus as many
  compiled steps at their median: what compiling cost;
- step: medians of --steps steps after those (eager: after --warmup steps), device synchronised;
- losses: every loss and both gradient norms of the first step of both sessions (same weights, batch
  and segments), the largest relative difference (inductor draws its own random numbers for dropout
  and the noise inside compiled parts, so this includes their effect, unless --fallback_random);
- payback: compiled steps after which the compilation is earned back.
For the MMS-size model on CUDA it prints the share of the arithmetic ceiling, ~6,300 samples/s on an
H100 or H200 (bench/bench_flops.py). JSON goes to bench/results/compile.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from bench.bench_flops import CEILING_SAMPLES_PER_SECOND  # noqa: E402
from bench.bench_step import (  # noqa: E402
    CORPUS_CLIPS,
    CORPUS_WORDS,
    DISCRIMINATOR_WIDTH,
    batches_of,
    make_model_dir,
    quiet_session,
    train_config,
)
from vits_trainer.data.loader import (  # noqa: E402
    ClipDataset,
    collate_batch,
    move_batch,  # noqa: E402
)
from vits_trainer.data.synthetic import make_corpus  # noqa: E402
from vits_trainer.model.compiled import SCOPES, LengthChecked, cached_graphs, graphs_between  # noqa: E402
from vits_trainer.training.loop import gan_step  # noqa: E402
from vits_trainer.training.runtime import quiet_transformers  # noqa: E402


def run_session(cfg, scope: str | None, backend: str | None, steps: int, warmup: int) -> dict:
    """`scope`: None for the eager step, else one of SCOPES."""
    torch.manual_seed(0)
    session = quiet_session(cfg)
    step_fn = gan_step(session)
    if scope is not None:
        step_fn.use_compiled(True, backend, scope)
    cache_before = cached_graphs()
    dataset = ClipDataset(session.data.train)
    batches = batches_of(session)
    device = session.device
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    times, first_metrics, skipped = [], None, 0
    for i in range(warmup + steps):
        batch = collate_batch([dataset[j] for j in batches[i % len(batches)]], session.pad)
        batch.pop("indices")
        batch.pop("text_lengths")
        batch = move_batch(batch, device)
        torch.manual_seed(1000 + i)  # the same segments and noise in both sessions
        start = time.perf_counter()
        result = step_fn(batch, 0, 1)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
        skipped += int(result.skipped)
        if first_metrics is None:
            first_metrics = {k: float(v) for k, v in result.metrics.items()}
    checked = [p for p in session.generator_raw.compiled.values() if isinstance(p, LengthChecked)]
    head, tail = times[:warmup], times[warmup:]
    median = statistics.median(tail)
    return {
        "first_steps_s": head,
        "step_s": median,
        "steps": len(tail),
        "samples_per_second": cfg.batch_size / median,
        "skipped_steps": skipped,
        "first_metrics": first_metrics,
        "peak_vram_gb": torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None,
        # compilations on new lengths, and the parts that went back to eager for them
        "recompiles": {p.name: p.recompiles for p in checked},
        # graphs inductor read back from its on-disk cache (TORCHINDUCTOR_CACHE_DIR), and compiled afresh
        "cache_hits_misses": list(graphs_between(cache_before, cached_graphs())),
        "eager_parts": {p.name: p.eager_reason for p in checked if p.eager_reason},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--models", default="tiny")
    parser.add_argument("--batch_sizes", default="8")
    parser.add_argument("--precision", default="no", choices=["no", "fp16", "bf16"])
    parser.add_argument("--length_buckets", default="on", choices=["on", "off"])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--warmup", type=int, default=2, help="eager steps not timed")
    parser.add_argument("--compile_steps", type=int, default=2, help="compiled steps counted as compilation")
    parser.add_argument("--backend", default=None, help="torch.compile backend (default: inductor)")
    parser.add_argument(
        "--scopes", default="segments", help=f"compiled scopes to compare, of {','.join(SCOPES)}"
    )
    parser.add_argument(
        "--fallback_random",
        action="store_true",
        help="inductor draws random numbers with torch's generator, as eager does: the losses compare",
    )
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "compile.json")
    args = parser.parse_args(argv)
    if args.fallback_random:
        import torch._inductor.config as inductor_config

        inductor_config.fallback_random = True
    scopes = args.scopes.split(",")
    if not set(scopes) <= set(SCOPES):
        parser.error(f"--scopes: choose from {', '.join(SCOPES)}")
    quiet_transformers()
    gpu = torch.cuda.get_device_name() if args.device == "cuda" else None
    print(
        f"torch {torch.__version__}, device {args.device}{' (' + gpu + ')' if gpu else ''}, {args.precision}"
    )
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench_compile-") as tmp_name:
        tmp = Path(tmp_name)
        data_dir = tmp / "data"
        make_corpus(
            data_dir, num_clips=CORPUS_CLIPS, seed=0, min_words=CORPUS_WORDS[0], max_words=CORPUS_WORDS[1]
        )
        for kind in args.models.split(","):
            model_dir = make_model_dir(kind, tmp / f"model-{kind}")
            for b in (int(x) for x in args.batch_sizes.split(",")):
                runs = {}
                for mode in ("eager", *scopes):
                    cfg = train_config(
                        tmp / f"{kind}-{b}-{mode}", data_dir, model_dir, kind, b, args.device, args.precision
                    )
                    cfg.length_buckets = args.length_buckets
                    scope = None if mode == "eager" else mode
                    warmup = args.warmup if scope is None else args.compile_steps
                    print(
                        f"{kind} batch {b} {mode}: {warmup} untimed + {args.steps} timed steps ...",
                        flush=True,
                    )
                    runs[mode] = run_session(cfg, scope, args.backend, args.steps, warmup)
                    if scope is not None:  # each row as soon as it is measured: a run cut short keeps it
                        rows.append(compare(kind, b, scope, runs["eager"], runs[scope], args))
                        write_rows(args.out, args.device, gpu, rows)
    write_rows(args.out, args.device, gpu, rows)
    print(f"wrote {args.out}")
    return 0


def write_rows(out: Path, device: str, gpu: str | None, rows: list[dict]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"device": device, "gpu": gpu, "rows": rows}, indent=2) + "\n")


def compare(kind: str, b: int, scope: str, eager: dict, comp: dict, args) -> dict:
    """One row: a compiled scope's run against the eager one, printed."""
    compile_s = sum(comp["first_steps_s"]) - len(comp["first_steps_s"]) * comp["step_s"]
    saved = eager["step_s"] - comp["step_s"]
    diff = max(
        abs(comp["first_metrics"][k] - v) / max(abs(v), 1e-6) for k, v in eager["first_metrics"].items()
    )
    row = {
        "model": kind,
        "discriminator_width": DISCRIMINATOR_WIDTH[kind],
        "batch_size": b,
        "precision": args.precision,
        "length_buckets": args.length_buckets,
        "backend": args.backend or "inductor",
        "scope": scope,
        "eager": eager,
        "compiled": comp,
        "compile_seconds": compile_s,
        "speedup": eager["step_s"] / comp["step_s"],
        "payback_steps": compile_s / saved if saved > 0 else None,
        "max_relative_loss_difference": diff,
    }
    ceiling = ""
    if kind == "mms" and args.device == "cuda":
        sps = comp["samples_per_second"]
        ceiling = f", {sps / CEILING_SAMPLES_PER_SECOND:.1%} of the arithmetic ceiling"
    payback = "never" if saved <= 0 else f"{compile_s / saved:.0f} steps"
    print(
        f"  eager {eager['step_s']:.3f} s ({eager['samples_per_second']:.1f} samples/s) | {scope} "
        f"{comp['step_s']:.3f} s ({comp['samples_per_second']:.1f} samples/s) | {row['speedup']:.2f}x | "
        f"compile {compile_s:.0f} s ({comp['cache_hits_misses'][0]} graphs from the cache, "
        f"{comp['cache_hits_misses'][1]} compiled), paid back after {payback} | "
        f"losses differ by at most {diff:.1e}{ceiling}",
        flush=True,
    )
    return row


if __name__ == "__main__":
    raise SystemExit(main())
