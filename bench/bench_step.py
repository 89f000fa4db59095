"""Benchmark one full training step and where its time goes (not a test).

    python bench/bench_step.py [--models tiny,mms] [--steps N] [--batch_sizes 8,16] [--mms_batch_sizes 8]
    python bench/bench_step.py --device cuda --precisions no,fp16,bf16 --batch_sizes 8,16,32 --mms_batch_sizes 8,16,32

Each (model, batch size) is set up exactly as train_vits.py does it (`build_session` on a temp model
folder and generated tone-language clips of about 3 s), then timed through the trainer's `GanStep` with
one optimiser step per call (no accumulation), on `--device` (cpu by default) in each of `--precisions`
(accelerate's names: no = fp32, fp16, bf16). A `SectionTimer` on both the step and the generator splits each step into spectrogram, mas,
generator, discriminator, backward and optimizer; "other" is the rest (loss arithmetic, glue). Data
wait is measured separately as the time to collate the step's batch from `ClipDataset`, as the loader
does with no workers. Warm-up steps (numba compile, allocator growth) are excluded; step times are
medians, a section's share is its total over all timed steps divided by their total step time.
On CUDA the section timer synchronises the device around every section, which slows the step: there
the same number of steps is run again without it, and samples/s comes from those.
On a shared machine a step during which other processes used more than --contention_limit of the
CPUs (read from /proc/stat) is discarded and run again, up to --max_attempts x --steps attempts.

Models: "tiny" is `vits_trainer.model.tiny.tiny_config` with a discriminator of width 0.125; "mms" is
transformers' default `VitsConfig()` (the MMS architecture, 36 M parameters) with a 39-entry
vocabulary and a full-width (1.0, 47 M parameters) discriminator.

It also measures the spectrogram design choice: (a) the linear spectrogram computed per batch on the
device (what the trainer does) versus (b) precomputing it: RAM per hour of audio and the cost of
collating precomputed spectrograms. JSON goes to bench/results/step.json.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import json
import math
import os
import platform
import statistics
import string
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the model folders are local: never reach for the hub

import numpy as np  # noqa: E402
import torch  # noqa: E402

from vits_trainer.data.loader import (  # noqa: E402
    ClipDataset,
    collate_batch,
    move_batch,  # noqa: E402
)
from vits_trainer.data.synthetic import make_corpus  # noqa: E402
from vits_trainer.model.fresh_init import init_like_vits  # noqa: E402
from vits_trainer.model.spectrogram import SpectrogramFrontEnd  # noqa: E402
from vits_trainer.model.tiny import make_tiny_model, make_tokenizer  # noqa: E402
from vits_trainer.profiling import NO_TIMER, SectionTimer  # noqa: E402
from vits_trainer.training.config import TrainConfig  # noqa: E402
from vits_trainer.training.loop import gan_step  # noqa: E402
from vits_trainer.training.runtime import quiet_transformers  # noqa: E402
from vits_trainer.training.session import Session, build_session  # noqa: E402

SECTIONS = ("spectrogram", "mas", "generator", "discriminator", "backward", "optimizer")
# 6-8 words of the tone language: 3.1 s on average (1.9-4.0 s), like a typical TTS utterance
CORPUS_CLIPS, CORPUS_WORDS = 96, (6, 8)
# 38 characters + the blank: an MMS-size vocabulary (VitsConfig defaults to 38); the corpus uses a-o
MMS_CHARACTERS = string.ascii_lowercase + " '-.,?!" + "àéíóú"
DISCRIMINATOR_WIDTH = {"tiny": 0.125, "mms": 1.0}
DEFAULT_STEPS = {"tiny": 20, "mms": 5}
DEFAULT_WARMUP = {"tiny": 2, "mms": 1}


def make_model_dir(kind: str, folder: Path) -> Path:
    """A freshly initialised model folder with its tokenizer, as a checkpoint would ship."""
    if kind == "tiny":
        return make_tiny_model(folder)
    from transformers import VitsConfig, VitsModel

    tokenizer = make_tokenizer(folder, MMS_CHARACTERS)
    torch.manual_seed(0)
    model = VitsModel(VitsConfig(vocab_size=len(tokenizer)))
    init_like_vits(model)  # VITS's own initialisation: transformers' overflows fp16 (fresh_init.py)
    model.save_pretrained(folder)
    return folder


def train_config(
    tmp: Path, data_dir: Path, model_dir: Path, kind: str, batch_size: int, device: str, precision: str
) -> TrainConfig:
    cfg = dataclasses.replace(
        TrainConfig(),
        data_dir=str(data_dir),
        model_name=str(model_dir),
        checkpoint_dir=str(tmp / "checkpoints"),
        output_dir=str(tmp / "final_model"),
        batch_size=batch_size,
        gradient_accumulation_steps=1,  # every timed call is a whole optimiser step
        discriminator_width=DISCRIMINATOR_WIDTH[kind],
        num_workers=0,
        val_fraction=0.05,
        eval_samples=0,
        mixed_precision=precision,
        resume="none",
        cpu=device == "cpu",
        seed=0,
    )
    cfg.validate()
    return cfg


def quiet_session(cfg: TrainConfig) -> Session:
    """build_session with its log and progress bars captured (printed only if it fails)."""
    buffer = io.StringIO()
    try:
        with contextlib.redirect_stdout(buffer), contextlib.redirect_stderr(buffer):
            return build_session(cfg, time.time())
    except BaseException:
        print(buffer.getvalue(), file=sys.stderr)
        raise


def batches_of(session: Session) -> list[list[int]]:
    """The sampler's first epoch: length-bucketed batches in the trainer's order, full ones only."""
    batches = [b for b in session.sampler if len(b) == session.cfg.batch_size]
    if not batches:
        raise SystemExit(f"no full batch of {session.cfg.batch_size}: generate more clips")
    return batches


class Contention:
    """The share of all CPUs that *other* processes used while a block ran (Linux /proc; else 0).

    On a shared 2-core machine one competing process slows a 2-thread torch step many times over
    (spinning OpenMP threads lose their cores), so disturbed steps are detected and measured again.
    """

    def __init__(self) -> None:
        self.available = os.path.exists("/proc/stat")
        self.tick = os.sysconf("SC_CLK_TCK") if self.available else 100
        self._start = (0.0, 0.0, 0.0)

    def _sample(self) -> tuple[float, float, float]:
        """(wall s, busy CPU s of the whole machine, CPU s of this process)."""
        if not self.available:
            return time.perf_counter(), 0.0, 0.0
        with open("/proc/stat") as f:
            values = [
                int(x) for x in f.readline().split()[1:9]
            ]  # user nice system idle iowait irq softirq steal
        busy = (sum(values) - values[3] - values[4]) / self.tick
        own = os.times()
        return time.perf_counter(), busy, own.user + own.system

    def start(self) -> None:
        self._start = self._sample()

    def stop(self) -> float:
        wall, busy, own = (b - a for a, b in zip(self._start, self._sample(), strict=True))
        if not self.available or wall <= 0:
            return 0.0
        # /proc/stat counts in ticks (10 ms): blocks much shorter than that read as noise
        return max(0.0, busy - own) / (wall * (os.cpu_count() or 1))


def bench_steps(
    session: Session, steps: int, warmup: int, contention_limit: float, max_attempts: int
) -> dict:
    cfg = session.cfg
    step_fn = gan_step(session)
    timer = SectionTimer(session.device)
    step_fn.timer = timer
    session.generator_raw.timer = timer
    dataset = ClipDataset(session.data.train)
    batches = batches_of(session)
    sample_rate = session.data.train.sample_rate
    monitor = Contention()
    skipped = [0]
    if session.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(session.device)

    def one_step(i: int) -> dict:
        indices = batches[i % len(batches)]
        start = time.perf_counter()
        batch = collate_batch([dataset[j] for j in indices])
        wait = time.perf_counter() - start
        batch.pop("indices")
        batch.pop("text_lengths")
        lengths = batch["audio_lengths"]
        batch = move_batch(batch, session.device)

        timer.reset()
        monitor.start()
        start, cpu_start = time.perf_counter(), time.process_time()
        result = step_fn(batch, 0, 1)
        if session.device.type == "cuda":
            torch.cuda.synchronize(session.device)
        total, cpu = time.perf_counter() - start, time.process_time() - cpu_start
        others = monitor.stop()
        if not result.synced:
            raise RuntimeError(f"step {i} did not reach an optimiser step")
        skipped[0] += int(result.skipped)  # fp16: the scaler may skip a step while it finds its scale
        unknown = set(timer.seconds) - set(SECTIONS)
        if unknown:
            raise RuntimeError(f"sections this benchmark does not know: {sorted(unknown)}")
        return {
            "total": total,
            "cpu": cpu,
            "wait": wait,
            "others": others,
            "clip_seconds": float(lengths.float().mean()) / sample_rate,
            "sections": {name: timer.seconds.get(name, 0.0) for name in SECTIONS},
        }

    for i in range(warmup):
        one_step(i)
    clean, disturbed = [], []
    untimed: list[float] = []
    for attempt in range(max(steps, max_attempts)):
        if len(clean) == steps:
            break
        record = one_step(warmup + attempt)
        (clean if record["others"] <= contention_limit else disturbed).append(record)
    if session.device.type == "cuda":
        # the timer's synchronisations cost real time on a GPU: throughput from steps without it
        step_fn.timer = session.generator_raw.timer = NO_TIMER
        for attempt in range(steps):
            untimed.append(one_step(warmup + steps + attempt)["total"])
        step_fn.timer = session.generator_raw.timer = timer
    records = clean
    if len(clean) < steps:
        print(
            f"  warning: only {len(clean)} of {steps} steps ran undisturbed (other processes used more than "
            f"{contention_limit:.0%} of the CPUs in {len(disturbed)}); disturbed steps are included"
        )
        records = clean + disturbed[: steps - len(clean)]

    totals = [r["total"] for r in records]
    sections = {name: [r["sections"][name] for r in records] for name in SECTIONS}
    # "other": what no section covers (loss arithmetic, concatenations, glue)
    sections["other"] = [r["total"] - sum(r["sections"].values()) for r in records]
    total_sum = sum(totals)
    split = {
        name: {"median_s": statistics.median(values), "share": sum(values) / total_sum}
        for name, values in sections.items()
    }
    step_s = statistics.median(untimed or totals)
    wait_s = statistics.median(r["wait"] for r in records)
    return {
        "batch_size": cfg.batch_size,
        "steps": len(records),
        "warmup": warmup,
        "discarded_disturbed_steps": len(disturbed) if len(clean) == steps else 0,
        "disturbed_steps_included": max(0, steps - len(clean)),
        "params_generator_m": sum(p.numel() for p in session.generator_raw.parameters()) / 1e6,
        "params_discriminator_m": sum(p.numel() for p in session.discriminator_raw.parameters()) / 1e6,
        "discriminator_width": cfg.discriminator_width,
        "segment_frames": session.generator_raw.segment_frames,
        "cudnn_benchmark": torch.backends.cudnn.benchmark if session.device.type == "cuda" else None,
        "precision": session.accelerator.mixed_precision,
        "device": str(session.device),
        "skipped_steps": skipped[0],
        "clip_seconds_mean": statistics.fmean(r["clip_seconds"] for r in records),
        "step_s_median": step_s,
        "step_s_all": untimed or totals,
        "step_s_median_with_section_timer": statistics.median(totals),
        "peak_memory_gb": (
            torch.cuda.max_memory_allocated(session.device) / 2**30 if session.device.type == "cuda" else None
        ),
        # CPU seconds of this process per step: about threads x wall when nothing else competes
        "step_cpu_s_median": statistics.median(r["cpu"] for r in records),
        "other_processes_cpu_share": [r["others"] for r in records],
        "data_wait_s_median": wait_s,
        "samples_per_s": cfg.batch_size / step_s,
        "samples_per_s_with_data": cfg.batch_size / (step_s + wait_s),
        "sections": split,
    }


# --- the spectrogram design choice ---------------------------------------------------------------


def median_time(
    fn: Callable[[], object], repeats: int, warmup: int = 2, contention_limit: float = 0.1, tries: int = 5
) -> float:
    """Median of `repeats` calls; the whole series is measured again when other processes disturbed it."""
    for _ in range(warmup):
        fn()
    monitor = Contention()
    for _ in range(tries):
        times = []
        monitor.start()
        for _ in range(repeats):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        if monitor.stop() <= contention_limit:
            break
    return statistics.median(times)


def collate_spectrograms(specs: list[np.ndarray]) -> torch.Tensor:
    """What a loader of precomputed spectrograms would do per batch: pad + stack into float32."""
    frames = max(s.shape[1] for s in specs)
    out = np.zeros((len(specs), specs[0].shape[0], frames), dtype=np.float32)
    for j, s in enumerate(specs):
        out[j, :, : s.shape[1]] = s  # fp16 sources are widened here, during the copy
    return torch.from_numpy(out)


def bench_spectrogram(session: Session, batch_sizes: list[int], repeats: int) -> dict:
    """(a) per-batch linear spectrogram on the device vs (b) precomputed: RAM and collate cost."""
    frontend = SpectrogramFrontEnd.from_vits_config(session.model.config).to(session.device)
    items = session.data.train
    dataset = ClipDataset(items)
    sample_rate, hop, bins = items.sample_rate, frontend.hop_length, frontend.bins
    # clips nearest to 3 s, so every batch size sees the same kind of clip
    order = np.argsort(np.abs(items.audio_lengths() / sample_rate - 3.0), kind="stable")
    frames_per_s = sample_rate / hop
    ram = {
        "spectrogram_fp32_bytes_per_hour": bins * frames_per_s * 4 * 3600,
        "spectrogram_fp16_bytes_per_hour": bins * frames_per_s * 2 * 3600,
        "audio_int16_bytes_per_hour": sample_rate * 2 * 3600,
    }
    rows = []
    for b in batch_sizes:
        chosen = [int(i) for i in order[:b]]
        audio_batch = collate_batch([dataset[i] for i in chosen])
        audio = audio_batch["audio"].to(session.device)
        seconds = float(audio_batch["audio_lengths"].sum()) / sample_rate

        def on_device(audio: torch.Tensor = audio) -> None:
            frontend.linear(audio)
            if audio.device.type == "cuda":
                torch.cuda.synchronize(audio.device)

        with torch.no_grad():
            device_s = median_time(on_device, repeats)
            # the precomputed store: one float32 (and one fp16) [bins, frames] array per clip
            specs32 = [
                frontend.linear(
                    torch.from_numpy(dataset[i]["audio"] / np.float32(32768.0))
                    .view(1, 1, -1)
                    .to(session.device)
                )[0]
                .cpu()
                .numpy()
                for i in chosen
            ]
        specs16 = [s.astype(np.float16) for s in specs32]
        rows.append(
            {
                "batch_size": b,
                "clip_seconds_mean": seconds / b,
                "a_device_linear_s": device_s,
                "b_collate_fp32_s": median_time(lambda s=specs32: collate_spectrograms(s), repeats),
                "b_collate_fp16_s": median_time(lambda s=specs16: collate_spectrograms(s), repeats),
                "audio_collate_s": median_time(
                    lambda c=chosen: collate_batch([dataset[i] for i in c]), repeats
                ),
                "spectrogram_batch_bytes": int(collate_spectrograms(specs32).nbytes),
                "audio_batch_bytes": int(audio.nbytes),
                # one-off cost of (b): computing every clip's spectrogram once, per hour of audio
                "precompute_s_per_hour": device_s / seconds * 3600,
            }
        )
    return {
        "device": str(session.device),
        "n_fft": frontend.n_fft,
        "hop": hop,
        "bins": bins,
        **ram,
        "rows": rows,
    }


# --- output --------------------------------------------------------------------------------------


def print_step_table(runs: list[dict]) -> None:
    columns = [*SECTIONS, "other"]
    header = f"{'model':<5} {'batch':>5} {'prec':>4} {'clip s':>6} {'step s':>7} {'cpu s':>7} {'samples/s':>9} {'data ms':>7}  "
    header += "  ".join(f"{c:>15}" for c in columns)
    print(header)
    print("-" * len(header))
    for r in runs:
        line = (
            f"{r['model']:<5} {r['batch_size']:>5} {r.get('precision', 'no'):>4} {r['clip_seconds_mean']:>6.2f} {r['step_s_median']:>7.3f} "
            f"{r['step_cpu_s_median']:>7.3f} "
            f"{r['samples_per_s']:>9.2f} {r['data_wait_s_median'] * 1e3:>7.2f}  "
        )
        line += "  ".join(
            f"{r['sections'][c]['median_s']:>7.3f} s {r['sections'][c]['share'] * 100:>3.0f}%"
            for c in columns
        )
        print(line)


def print_spectrogram(spec: dict, runs: list[dict]) -> None:
    mb = 1e6
    print(
        f"\nspectrogram design ({spec['bins']} bins, hop {spec['hop']}, on {spec['device']}):\n"
        f"  RAM per hour of audio: int16 audio {spec['audio_int16_bytes_per_hour'] / mb:.0f} MB; "
        f"precomputed linear spectrograms fp32 {spec['spectrogram_fp32_bytes_per_hour'] / mb:.0f} MB "
        f"({spec['spectrogram_fp32_bytes_per_hour'] / spec['audio_int16_bytes_per_hour']:.1f}x), "
        f"fp16 {spec['spectrogram_fp16_bytes_per_hour'] / mb:.0f} MB "
        f"({spec['spectrogram_fp16_bytes_per_hour'] / spec['audio_int16_bytes_per_hour']:.1f}x), "
        f"on top of the audio (still needed for the decoder's target and the discriminator)"
    )
    print(
        f"  {'batch':>5} {'clip s':>6} {'(a) on device':>13} {'(b) collate fp32':>16} {'(b) fp16':>9} "
        f"{'audio collate':>13} {'spec MB':>7} {'audio MB':>8} {'precompute/h':>12}"
    )
    for r in spec["rows"]:
        print(
            f"  {r['batch_size']:>5} {r['clip_seconds_mean']:>6.2f} {r['a_device_linear_s'] * 1e3:>10.1f} ms "
            f"{r['b_collate_fp32_s'] * 1e3:>13.1f} ms {r['b_collate_fp16_s'] * 1e3:>6.1f} ms "
            f"{r['audio_collate_s'] * 1e3:>10.2f} ms {r['spectrogram_batch_bytes'] / mb:>7.1f} "
            f"{r['audio_batch_bytes'] / mb:>8.1f} {r['precompute_s_per_hour']:>10.1f} s"
        )
    rows = spec["rows"]
    print(
        "  (a) costs "
        + ", ".join(f"{r['a_device_linear_s'] * 1e3:.1f} ms" for r in rows)
        + " per batch; (b) saves that per step but costs "
        + f"{spec['spectrogram_fp32_bytes_per_hour'] / spec['audio_int16_bytes_per_hour']:.0f}x the audio's RAM "
        + "(fp32), a precompute pass, and moves "
        + f"{rows[0]['spectrogram_batch_bytes'] / rows[0]['audio_batch_bytes']:.1f}x the bytes per batch"
    )
    by_batch = {r["batch_size"]: r for r in rows}
    for run in runs:
        r = by_batch.get(run["batch_size"])
        if r is not None:
            share = r["a_device_linear_s"] / run["step_s_median"]
            print(
                f"  {run['model']} batch {run['batch_size']}: (a) is {share * 100:.1f}% of its step "
                f"({r['a_device_linear_s'] * 1e3:.1f} ms of {run['step_s_median'] * 1e3:.0f} ms)"
            )


def machine_info() -> dict:
    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "cuda_device": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
    }


def int_list(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--models", default="tiny,mms", help="comma-separated: tiny, mms")
    parser.add_argument("--steps", type=int, default=None, help="timed steps (default: tiny 20, mms 5)")
    parser.add_argument(
        "--warmup", type=int, default=None, help="untimed first steps (default: tiny 2, mms 1)"
    )
    parser.add_argument("--batch_sizes", type=int_list, default=[8, 16], help="tiny model batch sizes")
    parser.add_argument("--mms_batch_sizes", type=int_list, default=[8], help="MMS-size model batch sizes")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument(
        "--precisions", default="no", help="comma-separated accelerate precisions: no (fp32), fp16, bf16"
    )
    parser.add_argument(
        "--cudnn_benchmark",
        choices=["on", "off"],
        default=None,
        help="override torch.backends.cudnn.benchmark (default: what the trainer sets)",
    )
    parser.add_argument("--spectrogram_repeats", type=int, default=20)
    parser.add_argument(
        "--contention_limit",
        type=float,
        default=0.1,
        help="a step during which other processes used more than this share of all CPUs is measured again",
    )
    parser.add_argument(
        "--max_attempts", type=int, default=4, help="at most this many x --steps attempts per configuration"
    )
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "step.json")
    parser.add_argument(
        "--merge",
        action="store_true",
        help="keep --out's results for the (model, batch) pairs this run does not measure",
    )
    args = parser.parse_args(argv)
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    for m in models:
        if m not in DEFAULT_STEPS:
            parser.error(f"--models: unknown model {m!r} (tiny, mms)")
    precisions = [p.strip() for p in args.precisions.split(",") if p.strip()]
    if not set(precisions) <= {"no", "fp16", "bf16"}:
        parser.error(f"--precisions: {args.precisions!r} (no, fp16, bf16)")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device here")

    quiet_transformers()  # no save_pretrained progress bars
    info = machine_info()
    print(
        f"torch {info['torch']}, {info['torch_threads']} threads, {info['cpu_count']} CPUs, "
        f"GPU {info['cuda_device'] or 'none'}; the sessions run on {args.device}"
    )
    runs: list[dict] = []
    spectrogram: dict | None = None
    with tempfile.TemporaryDirectory(prefix="bench_step-") as tmp_name:
        tmp = Path(tmp_name)
        data_dir = tmp / "data"
        make_corpus(
            data_dir, num_clips=CORPUS_CLIPS, seed=0, min_words=CORPUS_WORDS[0], max_words=CORPUS_WORDS[1]
        )
        for kind in models:
            model_dir = make_model_dir(kind, tmp / f"model-{kind}")
            steps = args.steps if args.steps is not None else DEFAULT_STEPS[kind]
            warmup = args.warmup if args.warmup is not None else DEFAULT_WARMUP[kind]
            for b in args.batch_sizes if kind == "tiny" else args.mms_batch_sizes:
                for precision in precisions:
                    print(
                        f"{kind} batch {b} {precision}: {warmup} warm-up + {steps} timed steps ...",
                        flush=True,
                    )
                    cfg = train_config(
                        tmp / f"run-{kind}-{b}-{precision}",
                        data_dir,
                        model_dir,
                        kind,
                        b,
                        args.device,
                        precision,
                    )
                    session = quiet_session(cfg)
                    if args.cudnn_benchmark is not None:
                        torch.backends.cudnn.benchmark = args.cudnn_benchmark == "on"
                    run = {
                        "model": kind,
                        **bench_steps(
                            session, steps, warmup, args.contention_limit, args.max_attempts * steps
                        ),
                    }
                    runs.append(run)
                    if spectrogram is None:
                        # same front end for both models (n_fft 1024, hop 256): measured once
                        sizes = sorted(set(args.batch_sizes) | set(args.mms_batch_sizes))
                        spectrogram = bench_spectrogram(session, sizes, args.spectrogram_repeats)
                    del session
                    if torch.cuda.is_available():
                        torch.cuda.empty_cache()

    command = "python bench/bench_step.py " + " ".join(argv if argv is not None else sys.argv[1:])
    for run in runs:
        run["command"] = command
    if args.merge and args.out.is_file():
        # e.g. the MMS-size rows measured again in a quiet moment, the tiny rows kept
        earlier = json.loads(args.out.read_text(encoding="utf-8"))

        def key(r: dict) -> tuple:
            return r["model"], r["batch_size"], r.get("precision", "no"), r.get("device", "cpu")

        measured = {key(r) for r in runs}
        kept = [r for r in earlier.get("runs", []) if key(r) not in measured]
        if kept:
            print(
                f"\nkept from {args.out.name}: "
                + ", ".join(f"{r['model']} batch {r['batch_size']}" for r in kept)
            )
        runs = sorted(
            kept + runs,
            key=lambda r: (list(DEFAULT_STEPS).index(r["model"]), r["batch_size"], r.get("precision", "no")),
        )
        spectrogram = spectrogram or earlier.get("spectrogram")

    print()
    print_step_table(runs)
    if spectrogram is not None:
        print_spectrogram(spectrogram, runs)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    result = {
        **info,
        "commands": list(dict.fromkeys(r.get("command", "?") for r in runs)),
        "precisions": precisions,
        "device": args.device,
        "corpus": {"clips": CORPUS_CLIPS, "words": list(CORPUS_WORDS)},
        "sections_note": "median_s per section; share = section total / step total over the timed steps",
        "runs": runs,
        "spectrogram": spectrogram,
    }
    args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    shown = args.out.relative_to(ROOT) if args.out.is_relative_to(ROOT) else args.out
    print(f"\nwrote {shown}")
    return 0 if all(math.isfinite(r["step_s_median"]) for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
