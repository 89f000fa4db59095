"""The pictures VITS users diagnose with, written at each evaluation to samples/step_N/:

- <clip>_alignment.png: the path the monotonic alignment search found (text tokens x frames) in the
  teacher-forced forward; a clean diagonal staircase means the model reads every token in order;
- <clip>_mel.png: the recorded log-mel above the one spoken from text alone (free-running).

They go to TensorBoard / W&B as images too, next to the audio.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from ..data.loader import ClipDataset, collate_batch, move_batch
from ..model.alignment import maximum_path
from ..model.vits import prior_log_likelihood, sequence_mask


@torch.no_grad()
def alignment_paths(generator, items, count: int, device: torch.device, seed: int = 1234) -> list[np.ndarray]:
    """[tokens, frames] 0/1 paths of the first `count` items: the search of the training forward
    (VitsGenerator.forward) on the same inputs, without the parts the path does not depend on
    (duration predictor, KL, decoder), which would double the cost of an evaluation. In fp32, one clip
    at a time: under bf16/fp16 training the path may differ from the step's by a tie here and there."""
    was_training = generator.training
    generator.eval()
    dataset = ClipDataset(items)
    paths = []
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        for k in range(min(count, len(items))):
            batch = move_batch(collate_batch([dataset[k]]), device)
            spec = generator.frontend.linear(batch["audio"])
            frames = batch["audio_lengths"] // generator.hop_length
            y_mask = sequence_mask(frames, spec.size(-1)).unsqueeze(1).to(spec.dtype)
            g = generator.speaker_embedding(batch["speaker_ids"])
            _, m_p, logs_p = generator.encode_text(batch["input_ids"], batch["attention_mask"])
            z, _, _ = generator.model.posterior_encoder(spec, y_mask, g)
            z_p = generator.model.flow(z, y_mask, g)
            log_lik = prior_log_likelihood(z_p.float(), m_p.float(), logs_p.float())
            path = maximum_path(log_lik, batch["text_lengths"], frames, backend=generator.mas_backend)
            paths.append(path[0].float().cpu().numpy())
    generator.train(was_training)
    return paths


def is_monotonic_cover(path: np.ndarray) -> bool:
    """Every frame on exactly one token, tokens in order one step at a time, first to last: the path
    reads every token, none skipped, none repeated out of order."""
    if path.ndim != 2 or path.shape[1] == 0 or not np.all(path.sum(0) == 1):
        return False
    token = path.argmax(0)
    steps = np.diff(token)
    return bool(token[0] == 0 and token[-1] == path.shape[0] - 1 and np.all((steps == 0) | (steps == 1)))


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def warm_up_pictures() -> None:
    """matplotlib's import and first drawing (fonts, backend): a one-time cost, paid before timing."""
    plt = _pyplot()
    fig = plt.figure(figsize=(1, 1))
    fig.canvas.draw()
    plt.close(fig)


def _save(fig, out: Path) -> Path:
    plt = _pyplot()
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)
    return out


def alignment_png(path: np.ndarray, out: Path, title: str = "") -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=80)
    ax.imshow(path, aspect="auto", origin="lower", interpolation="none", cmap="viridis")
    ax.set_xlabel("frame")
    ax.set_ylabel("text token")
    ax.set_title(title or "alignment", fontsize=9)
    return _save(fig, out)


def mel_png(recorded: np.ndarray, spoken: np.ndarray, out: Path, title: str = "") -> Path:
    plt = _pyplot()
    fig, axes = plt.subplots(2, 1, figsize=(6, 5), dpi=80)
    low, high = float(min(recorded.min(), spoken.min())), float(max(recorded.max(), spoken.max()))
    frames = max(recorded.shape[-1], spoken.shape[-1])  # one time axis: a spoken clip too short shows
    for ax, mel, label in ((axes[0], recorded, "recorded"), (axes[1], spoken, "spoken from text")):
        ax.imshow(mel, aspect="auto", origin="lower", interpolation="none", vmin=low, vmax=high)
        ax.set_xlim(-0.5, frames - 0.5)
        ax.set_ylabel("mel bin")
        ax.set_title(f"{title} {label}".strip(), fontsize=9)
    axes[1].set_xlabel("frame")
    return _save(fig, out)


def write_pictures(folder: Path, names: list[str], paths: list[np.ndarray], spoken) -> list[Path]:
    """Alignment PNGs for `paths` and mel PNGs for `spoken` (freerun.Spoken), named by clip."""
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name, path in zip(names, paths, strict=False):
        written.append(alignment_png(path, folder / f"{name}_alignment.png", name))
    for item in spoken:
        written.append(
            mel_png(item.recorded_mel, item.spoken_mel, folder / f"{item.name}_mel.png", item.name)
        )
    return written


def log_images_to_trackers(accelerator, pngs: list[Path], step: int) -> None:
    """The PNGs to TensorBoard / W&B (other trackers take no images)."""
    trackers = [
        t for t in getattr(accelerator, "trackers", []) if getattr(t, "name", "") in ("tensorboard", "wandb")
    ]
    if not trackers:
        return
    import matplotlib.image

    for tracker in trackers:
        for png in pngs:
            if tracker.name == "tensorboard":
                image = matplotlib.image.imread(png)[..., :3]  # RGBA floats in [0, 1] -> RGB
                tracker.writer.add_image(f"pictures/{png.stem}", image, step, dataformats="HWC")
            else:
                import wandb

                tracker.log({f"pictures/{png.stem}": wandb.Image(str(png))}, step=step)
