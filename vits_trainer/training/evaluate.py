"""Validation on held-out clips (teacher-forced mel and KL) and listening samples.

Runs on the unwrapped generator on every process with no collective operation inside, so it can
never deadlock a multi-GPU run; a fixed seed makes the stochastic parts (posterior sample, duration
noise) repeatable, so two evaluations of the same weights give the same numbers.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import numpy as np
import torch

from ..data.audio import write_wav as write_pcm16
from ..data.loader import HOST_ONLY_KEYS, move_batch
from ..model.losses import LossWeights
from ..model.synthesis import bounded_durations


def set_prefix(name: str) -> str:
    """What an evaluation's results of validation set `name` are prefixed with: none for "val", the
    primary set of train_vits.py; "<name>_" for the others (a feedback round's "feedback_val_mel")."""
    return "" if name == "val" else f"{name}_"


def _teacher_forced(generator, batch: dict[str, torch.Tensor], autocast=None):
    """The generator's full-length training forward on one validation batch (already on the device)."""
    with autocast() if autocast else contextlib.nullcontext():
        return generator(
            batch["input_ids"],
            batch["attention_mask"],
            batch["audio"],
            batch["audio_lengths"],
            batch.get("speaker_ids"),
            full_length=True,
        )


@torch.no_grad()
def evaluate(
    generator,
    loader,
    device: torch.device,
    autocast=None,
    seed: int = 1234,
    weights=None,
    by_speaker: dict[int, tuple[float, int]] | None = None,
) -> dict:
    """Mean validation losses over `loader`'s clips: val_mel (full-length L1 of log-mels), val_kl,
    val_duration, and val_loss (their weighted sum, with the training weights). The run's loaders give
    one clip at a time (datasplit.make_loaders): each clip's losses, averaged over clips.

    `by_speaker`, when given, is filled with {speaker id: (mean val_mel, clips)}: the same numbers split
    by voice, so a multi-speaker run sees which voice lags. A batch of several speakers' clips has one
    mean for all of them and is left out of it (the run's loaders never make one)."""
    weights = weights or LossWeights()
    was_training = generator.training
    generator.eval()
    keys = ("mel", "kl", "duration")
    rows, sizes, voices_of = [], [], []  # per batch: its losses (on the device), clips, its one voice or None
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        for batch in loader:
            # read on the host, before the batch moves: a device tensor's values would be one more wait
            voices = set(batch["speaker_ids"].tolist()) if "speaker_ids" in batch else {0}
            batch = move_batch(batch, device)
            out = _teacher_forced(generator, batch, autocast)
            # kept on the device: reading each clip's losses made the host wait for its forward before
            # queuing the next clip's (one read below, for the whole set)
            rows.append(
                torch.stack([torch.as_tensor(getattr(out, key), dtype=torch.float32) for key in keys])
            )
            sizes.append(batch["input_ids"].size(0))
            voices_of.append(voices.pop() if len(voices) == 1 else None)
    generator.train(was_training)
    values = torch.stack(rows).tolist() if rows else []
    sums, count = dict.fromkeys(keys, 0.0), sum(sizes)
    speaker_sums: dict[int, list] = {}  # speaker id -> [val_mel sum, clips]
    for losses, n, voice in zip(values, sizes, voices_of, strict=True):
        for key, value in zip(keys, losses, strict=True):
            sums[key] += value * n
        if voice is not None:
            entry = speaker_sums.setdefault(voice, [0.0, 0])
            entry[0] += losses[0] * n
            entry[1] += n
    if by_speaker is not None:
        by_speaker.update(
            {sid: (total / clips, clips) for sid, (total, clips) in sorted(speaker_sums.items())}
        )
    if count == 0:
        return {}
    result = {f"val_{k}": v / count for k, v in sums.items()}
    # the teacher-forced terms only: the adversarial ones need the discriminator (a new
    # reconstruction term belongs here too)
    result["val_loss"] = (
        weights.mel * result["val_mel"]
        + weights.kl * result["val_kl"]
        + weights.duration * result["val_duration"]
    )
    return result


@torch.no_grad()
def evaluate_per_clip(generator, items, device: torch.device, autocast=None, seed: int = 1234) -> dict:
    """{clip id: val_mel} with each clip evaluated alone (a batch of one: no padding, no neighbours),
    for paired before/after comparisons. The same seed and order give the same numbers; a different
    seed draws other posterior/duration noise, which is part of the measurement's own noise."""
    from ..data.loader import ClipDataset, collate_batch

    dataset = ClipDataset(items)
    was_training = generator.training
    generator.eval()
    mels = []  # on the device until the last clip is done (evaluate's reason)
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        for k in range(len(dataset)):
            batch = collate_batch([dataset[k]])
            batch = move_batch({n: v for n, v in batch.items() if n not in HOST_ONLY_KEYS}, device)
            out = _teacher_forced(generator, batch, autocast)
            mels.append(torch.as_tensor(out.mel, dtype=torch.float32))
    generator.train(was_training)
    values = torch.stack(mels).tolist() if mels else []
    return {items.clip_id(k): value for k, value in enumerate(values)}


@torch.no_grad()
def speak_texts(
    model, text_encoder, sentences: list[tuple[str, int]], device: torch.device, seed: int = 1234
) -> list[torch.Tensor]:
    """Waveforms (float, on `device`) of each (text, speaker id), spoken with the plain transformers
    inference path under a fixed seed: the same sentences in the same order give the same takes."""
    was_training = model.training
    model.eval()
    waveforms = []
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        for text, speaker in sentences:
            ids = torch.tensor([text_encoder.encode(text)], dtype=torch.long, device=device)
            kwargs = {"speaker_id": speaker} if model.config.num_speakers > 1 else {}
            with bounded_durations(model):  # a diverged model's durations: bounded, not a crash
                waveforms.append(model(input_ids=ids, **kwargs).waveform[0].float())
    model.train(was_training)
    return waveforms


def write_wav(path: Path, waveform: np.ndarray, sample_rate: int) -> Path:
    """A spoken sentence as a 16-bit WAV (clipped to full scale, atomic: data/audio.py's writer)."""
    write_pcm16(path, waveform, sample_rate)
    return path


def synthesize(
    model,
    text_encoder,
    sentences: list[tuple[str, str, int]],
    out_dir: Path,
    device: torch.device,
    seed: int = 1234,
) -> list[Path]:
    """Speak each (name, text, speaker id) with the plain transformers inference path; write 16-bit WAVs."""
    out_dir.mkdir(parents=True, exist_ok=True)
    waveforms = speak_texts(
        model, text_encoder, [(text, speaker) for _, text, speaker in sentences], device, seed
    )
    rate = model.config.sampling_rate
    return [
        write_wav(out_dir / f"{name}.wav", w.cpu().numpy(), rate)
        for (name, _, _), w in zip(sentences, waveforms, strict=True)
    ]
