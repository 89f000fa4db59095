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
    sums = {"mel": 0.0, "kl": 0.0, "duration": 0.0}
    count = 0
    speaker_sums: dict[int, list] = {}  # speaker id -> [val_mel sum, clips]
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        for batch in loader:
            # read on the host, before the batch moves: a device tensor's values would be one more wait
            voices = set(batch["speaker_ids"].tolist()) if "speaker_ids" in batch else {0}
            batch = move_batch(batch, device)
            out = _teacher_forced(generator, batch, autocast)
            n = batch["input_ids"].size(0)
            losses = {key: float(getattr(out, key)) for key in sums}
            for key in sums:
                sums[key] += losses[key] * n
            count += n
            if len(voices) == 1:
                entry = speaker_sums.setdefault(voices.pop(), [0.0, 0])
                entry[0] += losses["mel"] * n
                entry[1] += n
    generator.train(was_training)
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
    values = {}
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        for k in range(len(dataset)):
            batch = collate_batch([dataset[k]])
            batch = move_batch({n: v for n, v in batch.items() if n not in HOST_ONLY_KEYS}, device)
            out = _teacher_forced(generator, batch, autocast)
            values[items.clip_id(k)] = float(out.mel)
    generator.train(was_training)
    return values


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
