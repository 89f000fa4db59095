"""Training throughput of the runner, a naive baseline on the same data and model, and budget accuracy.

    python bench/bench_train.py throughput --models tiny,mms --batch_sizes 8,16,32
    python bench/bench_train.py baseline --models tiny --batch_sizes 8
    python bench/bench_train.py budget --minutes 2,5,10
    python bench/bench_train.py loader --batch_sizes 16
    python bench/bench_train.py micro --steps 14 --rounds 2
    python bench/bench_train.py defaults --models mms --steps 60 --clips 640
    python bench/bench_train.py loop --steps 300 --clips 640

throughput: the real Trainer (train_vits.py's loop, no evaluation) for a fixed number of steps on a
    generated tone-language corpus; samples/s is the median step's after 2 warm-up steps (as the naive
    loop's), step the budget's steady-state estimate, data wait the share of loop time spent waiting
    for the next batch.
baseline: what the seeds started from, on the same clips and model: every sample read from its WAV
    file by soundfile, the linear spectrogram computed on the CPU in the DataLoader, random batches
    (no length bucketing), constant LR. Same GAN step on the same model as the runner trains it
    (training mode, decoder weight norm). The ratio runner / baseline is printed.
loader: the data paths alone (no model): batches/s the runner's in-RAM loader and the naive per-sample
    WAV + CPU-spectrogram loader can deliver, i.e. the ceiling each puts on a fast GPU.
micro: the real Trainer with the default --batch_size 8 --gradient_accumulation_steps 4, the automatic
    micro-batch choice (its trial's steps included) against a forced --micro_batch_size 8, interleaved
    over --rounds; samples/s over every step of each run, medians and their ratio.
defaults: the naive loop on the clips of one default step (fp32, eager; printed at once), then the real
    Trainer with train_vits.py's default flags (batch 8 x 4, automatic micro-batch, precision, length
    buckets and compile; no evaluation) on as many clips per step; samples/s are medians over the second half of the runner's steps, after its
    trial and compilation, against the naive loop's, and the share of the arithmetic ceiling
    (bench/bench_flops.py: an H100's or H200's peak rate over an MMS-size sample's FLOPs). The same
    half on the wall clock (metrics.jsonl's samples_seen over time: the loop's logging and decisions
    between steps counted too, which a step's own time leaves out) is printed beside it, and on a GPU
    the share of a step the host waited at its read for the GPU's queued work (device_wait_fraction).
loop: what the runner's loop itself costs per optimiser step: the real Trainer at the default batch
    settings (8 x 4 clips a step, as one micro-batch of 32, the micro-batch a fast GPU's trial keeps;
    length buckets; no evaluation, no compile) with `GanStep.micro_step` replaced by a step that does no
    work but wait --step_ms (as the host waits at a GPU step's one read of its results; meanwhile the
    loader's workers prepare the next batches). The networks are left out, nothing else is: reading and
    merging the step's loader batches, moving them to the device, the budget, the stop decision, the LR
    schedules and the logging. The time between the ends of consecutive steps less that wait (median and
    90th percentile over --steps steps, the first 20 left out), with the loader in the process and with
    2 workers (train_vits.py's default). With --step_ms 0 the loop runs as fast as the batches come:
    32 clips over that median is then the most samples/s the data path and the loop deliver here.
budget: train_vits.py as a subprocess with --target_hours set to N minutes; wall time / target.
Writes bench/results/train_<what>.json. CUDA is used when present (fp16 and bf16 rows added).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from unittest import mock

import soundfile as sf
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.bench_flops import CEILING_SAMPLES_PER_SECOND  # noqa: E402
from vits_trainer.data.synthetic import make_corpus  # noqa: E402
from vits_trainer.model.fresh_init import init_like_vits  # noqa: E402
from vits_trainer.model.tiny import make_tiny_model, make_tokenizer  # noqa: E402
from vits_trainer.training.budget import Budget, TrainingLeft  # noqa: E402
from vits_trainer.training.config import TrainConfig  # noqa: E402

RESULTS = ROOT / "bench" / "results"


def machine() -> dict:
    cuda = torch.cuda.is_available()
    return {
        "platform": platform.platform(),
        "cpu_count": torch.get_num_threads(),
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(0) if cuda else None,
        "command": " ".join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]]),
    }


def make_model(kind: str, folder: Path) -> tuple[Path, float]:
    """(model folder, discriminator width) for "tiny" or "mms" (transformers' default VitsConfig = MMS size)."""
    if kind == "tiny":
        return make_tiny_model(folder), 0.125
    from transformers import VitsConfig, VitsModel

    tokenizer = make_tokenizer(folder)
    torch.manual_seed(0)
    model = VitsModel(VitsConfig(vocab_size=len(tokenizer), pad_token_id=0))
    init_like_vits(model)  # VITS's own initialisation: transformers' overflows fp16 (fresh_init.py)
    model.save_pretrained(folder)
    return folder, 1.0


def corpus(tmp: Path, clips: int) -> Path:
    data = tmp / "data"
    if not (data / "metadata.csv").exists():
        make_corpus(data, num_clips=clips, seed=0, min_words=5, max_words=8)  # ~3 s clips
    return data


def run_config(tmp: Path, data: Path, model: Path, width: float, steps: int, **overrides) -> TrainConfig:
    """train_vits.py's defaults for a measured run in a fresh folder under `tmp`: no evaluation (the
    loop's speed alone), no interval checkpoint, `steps` optimiser steps, the GPU when there is one;
    `overrides` on top."""
    out = Path(tempfile.mkdtemp(dir=tmp))
    settings = dict(
        data_dir=str(data),
        model_name=str(model),
        checkpoint_dir=str(out / "ckpt"),
        output_dir=str(out / "final"),
        discriminator_width=width,
        val_fraction=0.0,
        max_steps=steps,
        save_minutes=1e6,
        cpu=not torch.cuda.is_available(),
    )
    settings.update(overrides)
    return dataclasses.replace(TrainConfig(), **settings)


def precisions() -> list[str]:
    return ["no", "fp16", "bf16"] if torch.cuda.is_available() else ["no"]


def runner_throughput(
    tmp: Path,
    data: Path,
    model: Path,
    width: float,
    batch: int,
    precision: str,
    steps: int,
    accumulation: int = 1,
    micro: str = "auto",
):

    cfg = run_config(
        tmp,
        data,
        model,
        width,
        steps,
        batch_size=batch,
        gradient_accumulation_steps=accumulation,
        micro_batch_size=micro,
        learning_rate=1e-4,
        warmup_steps=0,
        benchmark_samples=batch * 2,
        mixed_precision=precision,
        num_workers=2,
        target_hours=10,
        log_every=1,
    )
    session, summary, records = train_and_read_metrics(cfg)
    vram = max((r.get("vram_gb", 0.0) for r in records), default=0.0)
    lines = [r for r in records if "loss_g" in r]  # one per step (log_every=1)
    steps_logged = [r["samples_per_second"] for r in lines]
    return {
        # as the naive loop's: the median step after 2 warm-up steps
        "samples_per_second": statistics.median(steps_logged[2:] or steps_logged),
        "wall_samples_per_second": wall_samples_per_second(lines, 2),  # the same steps, on the wall clock
        "samples_per_second_every_step": summary["samples_per_second"],
        "step_seconds": session.budget.average_step_seconds(),
        "data_wait_fraction": summary["data_wait_fraction"],
        "peak_vram_gb": vram or None,
        "micro_batch_size": summary["micro_batch_size"],
        "steps": summary["steps"],
    }


def wall_samples_per_second(steps: list[dict], first: int) -> float | None:
    """Training samples per wall-clock second from step line `first - 1` to the last (log_every=1): the
    loop as a whole, its logging, decisions and epoch ends included, where a line's samples_per_second
    times the steps alone. None without a line before `first`."""
    if first < 1 or len(steps) <= first:
        return None
    before, last = steps[first - 1], steps[-1]
    seconds = last["time"] - before["time"]
    return (last["samples_seen"] - before["samples_seen"]) / seconds if seconds > 0 else None


def train_and_read_metrics(cfg) -> tuple:
    """Build a session for `cfg`, train it; (session, train summary, metrics.jsonl records)."""
    from vits_trainer.training.loop import Trainer
    from vits_trainer.training.session import build_session

    session = build_session(cfg, time.time())
    summary = Trainer(session).train()
    lines = (Path(cfg.checkpoint_dir) / "metrics.jsonl").read_text().splitlines()
    return session, summary, [json.loads(x) for x in lines]


def training_left_ignoring_max_steps(budget: Budget) -> TrainingLeft:
    """Budget.training_left as if --max_steps were unset, in its place while `defaults` measures: the
    micro-batch and compile choices decide for the long run the measurement's few steps stand for.
    Takes every argument Budget.training_left takes (tests/test_gpu_check.py checks it)."""
    return TrainingLeft(budget.training_left_by_budget(), 0)


def defaults_throughput(
    tmp: Path,
    data: Path,
    model: Path,
    width: float,
    steps: int,
    compile_mode: str | None = None,
    precision: str | None = None,
    cudnn_benchmark: bool | None = None,
) -> dict:
    """The naive loop on the clips of one of train_vits.py's default steps, then the runner at its
    defaults for `steps` optimiser steps; the steady state is the second half of the runner's steps.
    `compile_mode` replaces the default --compile (off: the eager runner alone, without minutes of
    compilation), `precision` the default --mixed_precision (fp16 on a GPU that has bf16: what a T4
    trains in, with its loss scaler; the losses at the start and end and the skipped steps say whether
    it trains), `cudnn_benchmark` the trainer's cuDNN setting (off: it tunes each convolution again
    for every new shape). The naive loop goes first and its figure is printed at once: a lent GPU
    machine's call may end during the runner's compilation, and its log then still has both loops'
    rates."""

    defaults = TrainConfig()
    clips = defaults.step_clips
    naive = baseline_throughput(data, model, width, clips, max(4, min(steps // 4, 10)))
    print(f"naive loop, {clips} clips per step: {json.dumps(naive)}", flush=True)
    cfg = run_config(
        tmp,
        data,
        model,
        width,
        steps,
        target_hours=10,
        log_every=1,
        compile=compile_mode or defaults.compile,
        mixed_precision=precision or defaults.mixed_precision,
    )
    # --max_steps only ends the measurement: `auto` decides for the 10-hour run it stands for
    with contextlib.ExitStack() as stack:
        stack.enter_context(mock.patch.object(Budget, "training_left", training_left_ignoring_max_steps))
        if cudnn_benchmark is not None:  # in place of the session's setting (off), set as it sets it
            stack.enter_context(
                mock.patch(
                    "vits_trainer.training.session._cudnn_benchmark_off",
                    lambda device: setattr(torch.backends.cudnn, "benchmark", cudnn_benchmark),
                )
            )
        session, summary, records = train_and_read_metrics(cfg)
    steps_logged = [r for r in records if "loss_g" in r]
    steady = steps_logged[len(steps_logged) // 2 :]
    runner = statistics.median(r["samples_per_second"] for r in steady)
    wall = wall_samples_per_second(steps_logged, len(steps_logged) // 2)
    vram = max((r.get("vram_gb", 0.0) for r in records), default=0.0)
    losses = [r["loss_g"] for r in steps_logged]
    ends = max(1, min(5, len(losses) // 4))
    return {
        "clips_per_step": clips,
        "samples_per_second": runner,
        "samples_per_second_every_step": summary["samples_per_second"],
        "data_wait_fraction": statistics.median(r["data_wait_fraction"] for r in steady),
        # on a GPU: the host's wait at each step's read for the GPU's queued work (near 0: the host's
        # launches limit the step and the GPU waits for them; high: the GPU's work limits it)
        # (a step that compiled or recorded CUDA graphs has none: its time is the compiler's)
        "device_wait_fraction": (
            statistics.median(waits)
            if (waits := [r["device_wait_fraction"] for r in steady if "device_wait_fraction" in r])
            else None
        ),
        "naive_samples_per_second": naive["samples_per_second"],
        "naive_data_wait_fraction": naive["data_wait_fraction"],
        "runner_vs_naive": runner / naive["samples_per_second"],
        # the steady steps on the wall clock, the loop's own work between steps included
        "wall_samples_per_second": wall,
        "wall_vs_naive": wall / naive["samples_per_second"] if wall else None,
        "share_of_ceiling": runner / CEILING_SAMPLES_PER_SECOND,
        "precision": session.accelerator.mixed_precision,
        "cudnn_benchmark": torch.backends.cudnn.benchmark if session.device.type == "cuda" else None,
        "micro_batch_size": summary["micro_batch_size"],
        "compile": summary["compile"],
        "peak_vram_gb": vram or None,
        "steps": summary["steps"],
        "steady_steps": len(steady),
        # whether it trains: the mean generator loss of the first and the last few steps, steps skipped
        "loss_first": statistics.mean(losses[:ends]) if losses else None,
        "loss_last": statistics.mean(losses[-ends:]) if losses else None,
        "skipped_steps": summary.get("skipped_steps"),
    }


def loop_overhead(
    tmp: Path, data: Path, model: Path, width: float, steps: int, workers: int, step_seconds: float
) -> dict:
    """The `loop` mode's figures for one --num_workers and a step that waits `step_seconds` (the module
    docstring)."""
    import warnings

    from vits_trainer.model.losses import LOSS_KEYS
    from vits_trainer.training.step import GanStep, StepResult

    ends: list[float] = []  # when each optimiser step's networks would have been done

    def no_work(self, batch, first, last, scale):
        zero = torch.zeros((), device=batch["input_ids"].device)
        metrics = dict.fromkeys((*LOSS_KEYS, "loss_g", "loss_d"), zero)
        if last:
            metrics.update(grad_norm_d=zero, grad_norm_g=zero)
            time.sleep(step_seconds)
            ends.append(time.perf_counter())
        return StepResult(synced=last, metrics=metrics)

    defaults = TrainConfig()
    cfg = run_config(
        tmp,
        data,
        model,
        width,
        steps,
        micro_batch_size=str(defaults.step_clips),
        length_buckets="on",
        compile="off",
        num_workers=workers,
    )
    with mock.patch.object(GanStep, "micro_step", no_work), warnings.catch_warnings():
        # the LR schedules step after an optimiser step that never runs here
        warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step()`")
        train_and_read_metrics(cfg)
    gaps = sorted(b - a - step_seconds for a, b in zip(ends[20:], ends[21:], strict=False))
    if not gaps:
        raise SystemExit(f"loop: {len(ends)} steps ran; give more --steps (and --clips) than 21")
    median = statistics.median(gaps)
    return {
        "workers": workers,
        "step_ms": step_seconds * 1e3,
        "clips_per_step": defaults.step_clips,
        "steps_timed": len(gaps),
        "ms_per_step": median * 1e3,
        "ms_per_step_p90": gaps[int(0.9 * (len(gaps) - 1))] * 1e3,
        # with no wait: what the data path and the loop deliver at most
        "loop_samples_per_second": defaults.step_clips / median if not step_seconds else None,
    }


def micro_comparison(tmp: Path, data: Path, steps: int, rounds: int) -> list[dict]:
    """Default flags (8 x 4), automatic micro-batch vs forced 8, interleaved: a busy spell hits both."""
    model, width = make_model("tiny", tmp / "tiny")
    rows = []
    for r in range(rounds):
        for micro in ("auto", "8"):
            result = runner_throughput(tmp, data, model, width, 8, "no", steps, accumulation=4, micro=micro)
            # steady state: the budget's step time after the trial (the chosen size's steps only)
            result["steady_samples_per_second"] = 32 / result["step_seconds"]
            row = {"round": r, "micro": micro, **result}
            print(json.dumps(row), flush=True)
            rows.append(row)
    med = {  # over every step, the trial's included: its cost is part of what is compared
        m: statistics.median(x["samples_per_second_every_step"] for x in rows if x["micro"] == m)
        for m in ("auto", "8")
    }
    steady = {
        m: statistics.median(x["steady_samples_per_second"] for x in rows if x["micro"] == m)
        for m in ("auto", "8")
    }
    ratio, steady_ratio = med["auto"] / med["8"], steady["auto"] / steady["8"]
    print(
        f"median samples/s over every step: auto {med['auto']:.2f}, forced 8 {med['8']:.2f} -> x{ratio:.2f}; "
        f"after the trial: auto {steady['auto']:.2f}, forced 8 {steady['8']:.2f} -> x{steady_ratio:.2f}",
        flush=True,
    )
    rows.append(
        {
            "median_auto": med["auto"],
            "median_forced_8": med["8"],
            "ratio": ratio,
            "steady_ratio": steady_ratio,
        }
    )
    return rows


# ---- the naive baseline --------------------------------------------------------------------------


class NaiveDataset(torch.utils.data.Dataset):
    """Per-sample WAV reads and a CPU spectrogram, as the seed scripts did."""

    def __init__(self, data: Path, text, frontend):
        lines = (data / "metadata.csv").read_text(encoding="utf-8").splitlines()
        self.rows = [line.split("|") for line in lines if line]
        self.data, self.text, self.frontend = data, text, frontend

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        clip_id, text = self.rows[i][0], self.rows[i][1]
        audio, _ = sf.read(self.data / "wavs" / f"{clip_id}.wav", dtype="float32")
        audio = torch.from_numpy(audio)
        with torch.no_grad():
            spec = self.frontend.linear(audio.view(1, 1, -1))[0]
        return torch.tensor(self.text.encode(text)), audio, spec


def naive_collate(items):
    ids, audio, spec = zip(*items, strict=True)
    pad = torch.nn.utils.rnn.pad_sequence
    return {
        "input_ids": pad(list(ids), batch_first=True),
        "attention_mask": pad([torch.ones_like(x) for x in ids], batch_first=True),
        "audio": pad(list(audio), batch_first=True).unsqueeze(1),
        "audio_lengths": torch.tensor([a.numel() for a in audio]),
        "spectrogram": pad([s.T for s in spec], batch_first=True).transpose(1, 2),
    }


def baseline_throughput(data: Path, model_dir: Path, width: float, batch: int, steps: int) -> dict:
    from accelerate import Accelerator

    from vits_trainer.model.discriminator import DiscriminatorConfig, VitsDiscriminator
    from vits_trainer.model.spectrogram import SpectrogramFrontEnd
    from vits_trainer.training.networks import load_model, make_generator
    from vits_trainer.training.step import GanStep, make_optimizer

    acc = Accelerator(cpu=not torch.cuda.is_available())
    # the runner's model as the runner prepares it (decoder weight norm, training mode, its segments):
    # the two loops differ in how they feed and schedule the step, not in the step
    cfg = TrainConfig(model_name=str(model_dir))
    model, text, _, _ = load_model(cfg, None, print)
    gen = make_generator(cfg, model, print, acc.device)
    disc = VitsDiscriminator(DiscriminatorConfig(width=width))
    g_opt, d_opt = (
        make_optimizer(gen.parameters(), 1e-4),
        make_optimizer(disc.parameters(), 1e-4),
    )  # constant LR
    gen_p, disc_p = acc.prepare(gen, disc)
    step = GanStep(acc, gen_p, disc_p, g_opt, d_opt)
    dataset = NaiveDataset(data, text, SpectrogramFrontEnd.from_vits_config(model.config))
    loader = torch.utils.data.DataLoader(
        dataset, batch_size=batch, shuffle=True, num_workers=2, collate_fn=naive_collate
    )
    times, waits = [], []
    done = 0
    while done < steps + 2:
        it = iter(loader)
        while done < steps + 2:
            t0 = time.perf_counter()
            try:
                b = next(it)
            except StopIteration:
                break
            t1 = time.perf_counter()
            b = {k: v.to(acc.device) for k, v in b.items()}
            step(b)
            if acc.device.type == "cuda":
                torch.cuda.synchronize()
            if done >= 2:  # warm-up excluded, as in the runner's benchmark
                times.append(time.perf_counter() - t0)
                waits.append(t1 - t0)
            done += 1
    return {
        "samples_per_second": batch / statistics.median(times),
        "step_seconds": statistics.median(times),
        "data_wait_fraction": sum(waits) / sum(times),
    }


def loader_throughput(data: Path, model_dir: Path, batch: int, batches: int = 60) -> list[dict]:
    from vits_trainer.data.clipstore import load_clip_store
    from vits_trainer.data.items import build_items
    from vits_trainer.data.loader import make_loader
    from vits_trainer.data.sampler import BucketBatchSampler
    from vits_trainer.data.text import TextEncoder
    from vits_trainer.model.spectrogram import SpectrogramFrontEnd
    from vits_trainer.model.vits import load_vits_model

    model = load_vits_model(model_dir)
    text = TextEncoder.from_pretrained(model_dir)
    store, _ = load_clip_store(data, model.config.sampling_rate, log=lambda _: None, progress=False)
    items, _ = build_items(store, range(len(store)), text.encode, {"0": 0}, 256, log=lambda _: None)
    ours = make_loader(items, BucketBatchSampler(items.audio_lengths(), batch, seed=0), 0, False)
    ours2 = make_loader(items, BucketBatchSampler(items.audio_lengths(), batch, seed=0), 2, False)
    naive = torch.utils.data.DataLoader(
        NaiveDataset(data, text, SpectrogramFrontEnd.from_vits_config(model.config)),
        batch_size=batch,
        shuffle=True,
        num_workers=2,
        collate_fn=naive_collate,
    )
    rows = []
    for name, loader in (
        ("runner, 0 workers", ours),
        ("runner, 2 workers", ours2),
        ("baseline, 2 workers", naive),
    ):
        done, start = 0, None
        while done < batches:
            for _ in loader:
                done += 1
                if done == 3:
                    start = time.perf_counter()  # workers started, first batches out
                if done >= batches:
                    break
        seconds = time.perf_counter() - start
        rows.append(
            {"path": name, "batch_size": batch, "samples_per_second": (batches - 3) * batch / seconds}
        )
    return rows


# ---- budget accuracy -----------------------------------------------------------------------------


def budget_run(tmp: Path, data: Path, model: Path, minutes: float) -> dict:
    out = Path(tempfile.mkdtemp(dir=tmp))
    cmd = [
        sys.executable,
        str(ROOT / "train_vits.py"),
        "--data_dir",
        str(data),
        "--model_name",
        str(model),
        "--checkpoint_dir",
        str(out / "ckpt"),
        "--output_dir",
        str(out / "final"),
        "--target_hours",
        str(minutes / 60),
        "--batch_size",
        "8",
        "--gradient_accumulation_steps",
        "1",
        "--learning_rate",
        "2e-4",
        "--warmup_steps",
        "20",
        "--discriminator_width",
        "0.125",
        "--num_workers",
        "0",
        "--benchmark_samples",
        "64",
        "--val_fraction",
        "0.1",
        "--save_minutes",
        "1",
        *([] if torch.cuda.is_available() else ["--cpu"]),  # the device a user's run would get
    ]
    start = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.monotonic() - start
    summary = json.loads((out / "final" / "train_summary.json").read_text()) if proc.returncode == 0 else {}
    RESULTS.mkdir(parents=True, exist_ok=True)  # the run's log, to see why it ended where it did
    (RESULTS / f"budget_{minutes:g}min.log").write_text(proc.stdout + proc.stderr, encoding="utf-8")
    return {
        "target_seconds": minutes * 60,
        "process_wall_seconds": wall,
        "ratio": wall / (minutes * 60),
        "returncode": proc.returncode,
        "steps": summary.get("steps"),
        "data_wait_fraction": summary.get("data_wait_fraction"),
        "preload_seconds": summary.get("preload_seconds"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "what", choices=["throughput", "baseline", "budget", "loader", "loop", "micro", "defaults"]
    )
    parser.add_argument("--models", default="tiny")
    parser.add_argument("--batch_sizes", default="8")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--clips", type=int, default=160)
    parser.add_argument("--minutes", default="2,5,10")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--step_ms", type=float, default=100.0, help="loop: what a step waits (besides 0)")
    parser.add_argument(
        "--compile", choices=["auto", "on", "off"], help="defaults: replaces the default --compile"
    )
    parser.add_argument(
        "--precision",
        choices=["auto", "no", "fp16", "bf16"],
        help="defaults: replaces the default --mixed_precision",
    )
    parser.add_argument(
        "--cudnn_benchmark",
        choices=["on", "off"],
        help="defaults: cuDNN's benchmark mode in place of the trainer's setting (off)",
    )
    args = parser.parse_args()
    RESULTS.mkdir(parents=True, exist_ok=True)
    rows = []
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        data = corpus(tmp, args.clips)
        if args.what == "micro":
            rows = micro_comparison(tmp, data, args.steps, args.rounds)
        elif args.what == "loader":
            model, _ = make_model("tiny", tmp / "tiny")
            for batch in [int(b) for b in args.batch_sizes.split(",")]:
                for row in loader_throughput(data, model, batch):
                    print(json.dumps(row), flush=True)
                    rows.append(row)
        elif args.what == "loop":
            model, width = make_model("tiny", tmp / "tiny")  # never run: the step does no work
            for step_ms in sorted({0.0, args.step_ms}):
                for workers in (0, 2):
                    row = loop_overhead(tmp, data, model, width, args.steps, workers, step_ms / 1e3)
                    print(json.dumps(row), flush=True)
                    most = row["loop_samples_per_second"]
                    print(
                        f"loop, {workers} workers, a step waiting {step_ms:.0f} ms: the loop's own "
                        f"{row['ms_per_step']:.1f} ms per step of {row['clips_per_step']} clips (90th "
                        f"percentile {row['ms_per_step_p90']:.1f} ms)"
                        + (f": at most {most:,.0f} samples/s" if most else ""),
                        flush=True,
                    )
                    rows.append(row)
        elif args.what == "defaults":
            for kind in args.models.split(","):
                model, width = make_model(kind, tmp / kind)
                row = {
                    "model": kind,
                    **defaults_throughput(
                        tmp,
                        data,
                        model,
                        width,
                        args.steps,
                        args.compile,
                        args.precision,
                        None if args.cudnn_benchmark is None else args.cudnn_benchmark == "on",
                    ),
                }
                print(json.dumps(row), flush=True)
                wall = row["wall_samples_per_second"]
                print(
                    f"{kind}, default flags: {row['samples_per_second']:.1f} samples/s "
                    f"(data wait {row['data_wait_fraction']:.1%}), naive loop "
                    f"{row['naive_samples_per_second']:.1f}: x{row['runner_vs_naive']:.2f}; "
                    f"{row['share_of_ceiling']:.1%} of ~{CEILING_SAMPLES_PER_SECOND:,.0f} samples/s; "
                    + (
                        f"on the wall clock (the loop's work between steps too) {wall:.1f} samples/s, "
                        f"x{row['wall_vs_naive']:.2f}"
                        if wall
                        else "no wall-clock rate (too few steps)"
                    )
                    + (
                        f"; the host waited for the GPU's work {row['device_wait_fraction']:.0%} of a step"
                        if row["device_wait_fraction"] is not None
                        else ""
                    )
                    + f"; {row['precision']}, loss {row['loss_first']:.1f} -> {row['loss_last']:.1f}, "
                    f"{row['skipped_steps']} steps skipped",
                    flush=True,
                )
                rows.append(row)
        elif args.what == "budget":
            model, _ = make_model("tiny", tmp / "tiny")
            for minutes in [float(m) for m in args.minutes.split(",")]:
                row = {"minutes": minutes, **budget_run(tmp, data, model, minutes)}
                print(json.dumps(row), flush=True)
                rows.append(row)
        else:
            for kind in args.models.split(","):
                model, width = make_model(kind, tmp / kind)
                for batch in [int(b) for b in args.batch_sizes.split(",")]:
                    runs = (
                        [("runner", p) for p in precisions()]
                        if args.what == "throughput"
                        else [("baseline", "no"), ("runner", "no")]
                    )
                    for name, precision in runs:
                        if name == "runner":
                            result = runner_throughput(tmp, data, model, width, batch, precision, args.steps)
                        else:
                            result = baseline_throughput(data, model, width, batch, args.steps)
                        row = {
                            "model": kind,
                            "batch_size": batch,
                            "precision": precision,
                            "path": name,
                            **result,
                        }
                        print(json.dumps(row), flush=True)
                        rows.append(row)
    if args.what == "baseline":
        for r in rows:
            if r["path"] == "runner":
                base = next(
                    b
                    for b in rows
                    if b["path"] == "baseline"
                    and b["model"] == r["model"]
                    and b["batch_size"] == r["batch_size"]
                )
                r["speedup_vs_baseline"] = r["samples_per_second"] / base["samples_per_second"]
                print(
                    f"{r['model']} batch {r['batch_size']}: runner {r['samples_per_second']:.2f} samples/s, "
                    f"baseline {base['samples_per_second']:.2f} -> x{r['speedup_vs_baseline']:.2f}"
                )
    (RESULTS / f"train_{args.what}.json").write_text(
        json.dumps({"machine": machine(), "rows": rows}, indent=1)
    )


if __name__ == "__main__":
    main()
