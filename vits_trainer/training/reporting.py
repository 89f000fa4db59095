"""What the user sees and keeps: the progress bar or log lines, metrics.jsonl, the loss-curve PNG,
and accelerate's trackers (TensorBoard / W&B) with validation audio."""

from __future__ import annotations

import math
import time
from pathlib import Path

import torch

from ..jsonfile import strict_json
from ..terminal import clock_text, is_interactive
from .report import current_history, primary, read_metrics
from .runtime import Logger


def _fmt_seconds(seconds: float) -> str:
    return clock_text(int(seconds))


def _fmt(value: float | None) -> str:
    return "non-finite" if value is None else f"{value:.3f}"


def vram_text(device: torch.device) -> str | None:
    if device.type != "cuda":
        return None
    used = torch.cuda.memory_reserved(device) / 2**30
    total = torch.cuda.get_device_properties(device).total_memory / 2**30
    return f"{used:.1f}/{total:.0f}G"


class MetricsLog:
    """Append-only JSON lines; a resumed run keeps appending to the same file."""

    def __init__(self, path: Path, enabled: bool):
        self.path = path
        self.enabled = enabled
        # a process killed mid-write can leave half a line: end it so the next record starts clean
        if enabled and path.is_file() and path.stat().st_size:
            with open(path, "rb") as f:
                f.seek(-1, 2)
                if f.read(1) != b"\n":
                    with open(path, "a", encoding="utf-8") as g:
                        g.write("\n")

    def write(self, record: dict) -> None:
        if not self.enabled:
            return
        if "time" not in record:  # every record on the wall clock: report.html's timeline places it
            record = {**record, "time": time.time()}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(strict_json(record, ensure_ascii=False) + "\n")


# tqdm's without its time left: steps left of a plan that re-plans, at a rate slowed by evaluations,
# it disagreed with the budget's own ETA in the postfix
BAR_FORMAT = "{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}, {rate_fmt}{postfix}]"


class Progress:
    """A tqdm bar on a terminal, plain lines otherwise (logs of Kaggle/Colab/CI are not TTYs). While
    the bar is drawn, `log` prints its lines above it."""

    def __init__(self, log, enabled: bool, device: torch.device, max_steps: int = 0, step: int = 0):
        self.log = log
        self.device = device
        self.enabled = enabled
        self.max_steps = max_steps  # --max_steps: the bar's total, when it comes first
        self.bar = None
        if enabled and is_interactive():
            from tqdm import tqdm

            self.bar = tqdm(
                total=max_steps or None,
                initial=step,
                unit="step",
                dynamic_ncols=True,
                leave=True,
                bar_format=BAR_FORMAT if max_steps else None,  # tqdm's own until a total is known
            )
            log.print_around(self.bar)

    def set_total(self, total: int, done: int) -> None:
        if self.bar is not None:
            before = self.bar.total
            self.bar.total = min(total, self.max_steps) if self.max_steps else total
            # a longer plan lowers the percentage (61% -> 54%), which reads as lost progress: the bar
            # says the plan grew, until a re-plan shortens it again
            grew = before and self.bar.total > before
            self.bar.set_description_str(f"plan {before:,}->{self.bar.total:,} steps" if grew else "", False)
            self.bar.bar_format = BAR_FORMAT
            self.bar.n = done
            self.bar.refresh()

    def update(self, step: int, values: dict, budget, epoch_eta: float | None) -> None:
        if not self.enabled:
            return
        fields = {
            "loss": _fmt(values.get("loss_g")),
            "mel": _fmt(values.get("mel")),
            "samples/s": f"{values['samples_per_second']:.1f}",
        }
        if values.get("compile_seconds"):
            fields["compiling"] = _fmt_seconds(math.ceil(values["compile_seconds"]))  # never "0:00"
        fields["wait"] = f"{100 * values['data_wait_fraction']:.0f}%"
        vram = vram_text(self.device)
        if vram:
            fields["vram"] = vram
        if epoch_eta is not None:
            fields["epoch ETA"] = _fmt_seconds(epoch_eta)
        fields["ETA"] = _fmt_seconds(budget.session_left())
        line = f"step {step} | " + " | ".join(f"{k} {v}" for k, v in fields.items())
        if self.bar is not None:
            self.bar.n = step
            self.bar.set_postfix(fields, refresh=True)
            Logger.copy.add(line)  # train.log has the progress a closed terminal's bar took with it
        else:
            self.log(line)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.log.print_around(None)
            self.bar = None


def plot_losses(metrics_path: Path, out_path: Path) -> Path | None:
    """Training mel loss and validation mel against steps, from metrics.jsonl."""
    if not metrics_path.is_file():
        return None
    train, val, freerun = [], [], []
    for record in current_history(read_metrics(metrics_path)):
        if record.get("event") == "eval" and primary(record, "val_mel") is not None:
            val.append((record["step"], primary(record, "val_mel")))  # the set that picks the best model
            if primary(record, "val_mel_dtw") is not None:
                scores = (primary(record, k) for k in ("val_mel_dtw", "val_mcd", "val_duration_ratio"))
                freerun.append((record["step"], *scores))
        elif "mel" in record:
            train.append((record["step"], record["mel"], record.get("loss_g")))
    if not train and not val:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if freerun:  # a second panel for the free-running scores in their own units (dB, ratio)
        fig, (ax, ax_free) = plt.subplots(2, 1, figsize=(8, 7), dpi=100, sharex=True, height_ratios=(3, 2))
    else:
        fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    if train:
        ax.plot([t[0] for t in train], [t[1] for t in train], label="train mel L1", alpha=0.8)
    if val:
        ax.plot([v[0] for v in val], [v[1] for v in val], "o-", label="validation mel L1")
    if freerun:
        steps = [v[0] for v in freerun]
        ax.plot(steps, [v[1] for v in freerun], "s-", label="validation mel L1 after DTW (spoken from text)")
        ax_free.plot(steps, [v[2] for v in freerun], "o-", color="C3", label="val MCD (dB)")
        ax_free.set_ylabel("mel-cepstral distortion (dB)")
        ax_free.grid(alpha=0.3)
        ratio = ax_free.twinx()
        ratio.plot(
            steps, [v[3] for v in freerun], "^--", color="C4", label="duration ratio (spoken / recorded)"
        )
        ratio.set_ylabel("duration ratio")
        lines = ax_free.get_lines() + ratio.get_lines()
        ax_free.legend(lines, [line.get_label() for line in lines], fontsize=8)
        ax_free.set_xlabel("optimizer step")
    else:
        ax.set_xlabel("optimizer step")
    ax.set_ylabel("mel L1 (log-mel)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    tmp = out_path.with_name(out_path.name + ".tmp.png")
    fig.savefig(tmp)
    plt.close(fig)
    tmp.replace(out_path)  # loss_curve.png in the run's checkpoint dir: the tool's own file
    return out_path


def log_audio_to_trackers(accelerator, paths: list[Path], step: int, sample_rate: int) -> None:
    """Validation samples to TensorBoard / W&B; other trackers get nothing (they take no audio)."""
    import soundfile as sf

    for tracker in getattr(accelerator, "trackers", []):
        name = getattr(tracker, "name", "")
        for path in paths:
            audio, sr = sf.read(path, dtype="float32")
            if name == "tensorboard":
                tracker.writer.add_audio(
                    f"samples/{path.stem}", torch.from_numpy(audio), step, sample_rate=sr
                )
            elif name == "wandb":
                import wandb

                tracker.log({f"samples/{path.stem}": wandb.Audio(audio, sample_rate=sr)}, step=step)
