"""Threading settings under load: the tiny model's step with and without CPU-bound competitors (not a test).

    python bench/bench_threads.py [--rounds 2] [--quiet_steps 3] [--loaded_steps 2] [--blocks 3]

Each variant (environment variables torch and numba read when they load) runs in its own process, which
times optimiser steps of the tiny model at batch 8 (set up as in bench/bench_step.py) in alternating blocks:
a quiet block, then a loaded block during which this script runs two ``while True: pass`` processes,
stopped after the block. So each process gives quiet and loaded times from the same minutes, and the
variants are interleaved (A/B/C/A/B/C ...) so that a busy spell of the shared machine hits them all.
Medians per variant, the loaded/quiet ratio and each quiet median against the default's. The load the
machine had besides (uptime, the busiest processes) is printed and saved: on a shared machine the "quiet"
blocks are only as quiet as the others let them be. Writes bench/results/threads.json.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# None: the variable is removed from the child's environment (the library default).
THREAD_VARS = (
    "OMP_WAIT_POLICY",
    "OMP_NUM_THREADS",
    "NUMBA_NUM_THREADS",
    "NUMBA_THREADING_LAYER",
    "MKL_NUM_THREADS",
    "GOMP_SPINCOUNT",
)
CONFIGURE = "BENCH_THREADS_CONFIGURE"  # the child calls the trainer's configure_threads
VARIANTS: dict[str, dict[str, str]] = {
    "default": {},
    "passive": {"OMP_WAIT_POLICY": "PASSIVE"},
    "1 thread": {"OMP_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "1"},
    "passive+workqueue": {
        "OMP_WAIT_POLICY": "PASSIVE",
        "NUMBA_THREADING_LAYER": "workqueue",
    },
    # GNU OpenMP (torch's CPU wheels) spins this many iterations before it sleeps; the default is ~300k
    "spin 1k": {"GOMP_SPINCOUNT": "1000"},
    "spin 3k": {"GOMP_SPINCOUNT": "3000"},
    "spin 10k": {"GOMP_SPINCOUNT": "10000"},
    "spin 100k": {"GOMP_SPINCOUNT": "100000"},
    "trainer (configure_threads)": {CONFIGURE: "1"},
    "1 thread spin 10k": {"OMP_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "1", "GOMP_SPINCOUNT": "10000"},
}
# what the loaded blocks run beside the step: plain Python loops, or other torch processes whose own
# OpenMP threads spin too (a second training run, a notebook)
COMPETITOR_CODE = {
    "python": "while True: pass",
    "torch": "import torch\na = torch.randn(192, 192)\nwhile True: a @ a",
}
COMPETITORS = 2


def start_competitors(n: int, kind: str = "python") -> list[subprocess.Popen]:
    env = {k: v for k, v in os.environ.items() if k not in THREAD_VARS}  # the competitors keep the defaults
    return [subprocess.Popen([sys.executable, "-c", COMPETITOR_CODE[kind]], env=env) for _ in range(n)]


def stop_competitors(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        p.kill()
    for p in procs:
        p.wait()


def child(args: argparse.Namespace) -> int:
    """One variant: the environment is already set; the trainer's own setting runs as the CLIs run it."""
    from vits_trainer.training.runtime import configure_threads

    settings = configure_threads() if os.environ.get(CONFIGURE) else None
    # a killed benchmark must not leave its competitors spinning: SIGTERM runs the finally below
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    from bench.bench_step import batches_of, quiet_session, train_config
    from vits_trainer.data.loader import ClipDataset, collate_batch, move_batch
    from vits_trainer.training.loop import gan_step

    tmp = Path(tempfile.mkdtemp(prefix="bench_threads-"))
    cfg = train_config(tmp, args.data_dir, args.model_dir, "tiny", args.batch_size, "cpu", "no")
    session = quiet_session(cfg)
    step_fn = gan_step(session)
    dataset = ClipDataset(session.data.train)
    batches = batches_of(session)
    count = [0]

    def step() -> float:
        indices = batches[count[0] % len(batches)]
        count[0] += 1
        batch = collate_batch([dataset[j] for j in indices])
        batch.pop("indices")
        batch.pop("text_lengths")
        batch = move_batch(batch, session.device)
        start = time.perf_counter()
        step_fn(batch, 0, 1)
        seconds = time.perf_counter() - start
        print(f"step {count[0]}: {seconds:.2f} s", file=sys.stderr, flush=True)
        return seconds

    for _ in range(2):  # numba compile, allocator
        step()
    quiet, loaded = [], []
    for _ in range(args.blocks):
        quiet += [step() for _ in range(args.quiet_steps)]
        procs = start_competitors(COMPETITORS, args.competitor)
        try:
            time.sleep(0.5)
            loaded += [step() for _ in range(args.loaded_steps)]
        finally:
            stop_competitors(procs)
        time.sleep(0.5)
    import numba
    import torch

    print(
        "RESULT "
        + json.dumps(
            {
                "quiet": quiet,
                "loaded": loaded,
                "settings": settings,
                "torch_threads": torch.get_num_threads(),
                "numba_threads": numba.get_num_threads(),
                "numba_layer": numba.threading_layer(),
            }
        ),
        flush=True,
    )
    return 0


def machine_load() -> dict:
    ps = subprocess.run(
        ["ps", "-eo", "pcpu,etime,args", "--sort=-pcpu"], capture_output=True, text=True
    ).stdout.splitlines()
    return {
        "uptime": subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip(),
        "busiest": [line[:120] for line in ps[1:6]],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--blocks", type=int, default=3)
    parser.add_argument("--quiet_steps", type=int, default=3)
    parser.add_argument("--loaded_steps", type=int, default=2)
    parser.add_argument("--batch_size", type=int, default=8)
    parser.add_argument(
        "--competitor", choices=sorted(COMPETITOR_CODE), default="python", help="what the loaded blocks run"
    )
    parser.add_argument(
        "--variants", default=",".join(VARIANTS), help="comma-separated, of: " + ", ".join(VARIANTS)
    )
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "threads.json")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--data_dir", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--model_dir", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return child(args)
    names = [v.strip() for v in args.variants.split(",") if v.strip()]
    for name in names:
        if name not in VARIANTS:
            parser.error(f"--variants: unknown variant {name!r}")

    from vits_trainer.data.synthetic import make_corpus
    from vits_trainer.model.tiny import make_tiny_model

    results: dict[str, list[dict]] = {n: [] for n in names}
    loads = [machine_load()]
    print(f"before: {loads[0]['uptime']}")
    with tempfile.TemporaryDirectory(prefix="bench_threads-") as tmp_name:
        tmp = Path(tmp_name)
        data_dir, model_dir = tmp / "data", make_tiny_model(tmp / "model")
        make_corpus(data_dir, num_clips=96, seed=0, min_words=6, max_words=8)
        base = {k: v for k, v in os.environ.items() if k not in THREAD_VARS}
        base.setdefault("HF_HUB_OFFLINE", "1")
        for r in range(args.rounds):
            order = names[r % len(names) :] + names[: r % len(names)]  # a different variant first each round
            for name in order:
                cmd = [
                    sys.executable,
                    __file__,
                    "--child",
                    "--data_dir",
                    str(data_dir),
                    "--model_dir",
                    str(model_dir),
                    "--blocks",
                    str(args.blocks),
                    "--quiet_steps",
                    str(args.quiet_steps),
                    "--loaded_steps",
                    str(args.loaded_steps),
                    "--batch_size",
                    str(args.batch_size),
                    "--competitor",
                    args.competitor,
                ]
                proc = subprocess.run(cmd, env={**base, **VARIANTS[name]}, capture_output=True, text=True)
                line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
                if proc.returncode != 0 or line is None:
                    print(proc.stdout[-2000:], proc.stderr[-3000:], file=sys.stderr)
                    raise SystemExit(f"variant {name!r} failed (exit {proc.returncode})")
                record = json.loads(line[len("RESULT ") :])
                results[name].append(record)
                print(
                    f"round {r + 1} {name}: quiet {statistics.median(record['quiet']):.2f} s, loaded "
                    f"{statistics.median(record['loaded']):.2f} s (torch {record['torch_threads']} threads, "
                    f"numba {record['numba_threads']} {record['numba_layer']})",
                    flush=True,
                )
            loads.append(machine_load())
    rows = []
    for name in names:
        quiet = [t for rec in results[name] for t in rec["quiet"]]
        loaded = [t for rec in results[name] for t in rec["loaded"]]
        rows.append(
            {
                "variant": name,
                "env": VARIANTS[name],
                "quiet_median_s": statistics.median(quiet),
                "loaded_median_s": statistics.median(loaded),
                "loaded_max_s": max(loaded),
                "ratio_loaded_quiet": statistics.median(loaded) / statistics.median(quiet),
                "settings": results[name][0]["settings"],
                "steps": {"quiet": quiet, "loaded": loaded},
            }
        )
    default_quiet = next((r["quiet_median_s"] for r in rows if r["variant"] == "default"), None)
    print(
        f"\ntiny model, batch {args.batch_size}, {COMPETITORS} {args.competitor} competitors in the loaded blocks; medians"
    )
    print(
        f"{'variant':<28} {'quiet s':>8} {'loaded s':>9} {'max s':>7} {'loaded/quiet':>13} {'quiet/default':>14}"
    )
    for r in rows:
        rel = f"{r['quiet_median_s'] / default_quiet:.2f}" if default_quiet else "-"
        print(
            f"{r['variant']:<28} {r['quiet_median_s']:>8.2f} {r['loaded_median_s']:>9.2f} "
            f"{r['loaded_max_s']:>7.2f} {r['ratio_loaded_quiet']:>13.2f} {rel:>14}"
        )
    for load in loads:
        print(f"load: {load['uptime']}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    command = "python bench/bench_threads.py " + " ".join(argv if argv is not None else sys.argv[1:])
    args.out.write_text(
        json.dumps(
            {"command": command, "cpu_count": os.cpu_count(), "rows": rows, "machine_load": loads}, indent=1
        )
        + "\n",
        encoding="utf-8",
    )
    print(f"wrote {args.out.relative_to(ROOT) if args.out.is_relative_to(ROOT) else args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
