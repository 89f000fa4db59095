"""Speaking from text with a saved model folder: the work behind `python speak.py`.

Any transformers VITS folder loads here (config.json, weights, tokenizer files), the tool's own exports
included. Text is encoded by the checkpoint's own tokenizer exactly as training encodes it
(data/text.py: uroman where the tokenizer wants it) and spoken by the plain `VitsModel` forward, the
inference path of transformers' `pipeline("text-to-speech")`. WAVs are written by data/audio.py's
`write_wav` (16-bit, clipped, atomic), the writer of prepared clips.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from transformers import VitsModel

from ..data.text import TextEncoder
from ..errors import UserError
from .vits import load_vits_model

# frames one token may last when spoken: far beyond speech (a character is ~5-20 frames), a bound on
# what a diverged duration predictor asks for (197 GB for one sentence, seen after LR 1.0)
MAX_FRAMES_PER_TOKEN = 200


@contextlib.contextmanager
def bounded_durations(model: VitsModel) -> Iterator[None]:
    """While inside: each token's predicted duration at most MAX_FRAMES_PER_TOKEN frames, a NaN one a
    single frame (the duration predictor's log-durations, clamped on their way out of it)."""
    cap = math.log(MAX_FRAMES_PER_TOKEN - 0.5)  # rounded up to whole frames after exp

    def clamp(module, args, log_duration):
        return torch.nan_to_num(log_duration, nan=0.0, posinf=cap, neginf=-cap).clamp(max=cap)

    handle = model.duration_predictor.register_forward_hook(clamp)
    try:
        yield
    finally:
        handle.remove()


@dataclass
class Voice:
    """A model folder loaded for speaking."""

    model: VitsModel
    text: TextEncoder
    device: torch.device

    @property
    def sampling_rate(self) -> int:
        return int(self.model.config.sampling_rate)


@dataclass
class Take:
    """One sentence spoken: the waveform and how long speaking it took."""

    waveform: np.ndarray  # float32 in [-1, 1] (clipped when written)
    seconds_taken: float
    sampling_rate: int

    @property
    def seconds_of_audio(self) -> float:
        return len(self.waveform) / self.sampling_rate


def choose_device(requested: str) -> torch.device:
    """`auto`: the GPU when there is one, else the CPU; `cuda` without a GPU is an error."""
    if requested == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda: no CUDA device is available here (use --device cpu or auto)")
    if requested == "auto":
        requested = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(requested)


def load_voice(model_dir: Path, device: torch.device, flag: str = "--model") -> Voice:
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # a per-load progress bar is noise in a one-line-per-file report
    text = TextEncoder.from_pretrained(model_dir)
    try:
        model = load_vits_model(model_dir)
    except (OSError, ValueError, RuntimeError) as err:
        reason = " ".join(str(err).split())[:300] or type(err).__name__
        raise UserError(f"{flag} {model_dir}: cannot load the model ({reason})") from None
    return Voice(model.to(device).eval(), text, device)


def encode_sentence(voice: Voice, text: str, where: str) -> list[int]:
    """The token ids of `text`; a sentence with nothing the tokenizer knows is an error naming `where`."""
    ids = voice.text.encode(text)
    tokenizer = voice.text.tokenizer
    filler = {tokenizer.pad_token_id, tokenizer.unk_token_id}  # the blank between characters, unknowns
    if all(i in filler for i in ids):
        shown = text if len(text) <= 60 else text[:57] + "..."
        raise UserError(
            f"{where}: {shown!r} has no character this model's vocabulary knows, nothing to speak"
        )
    return ids


def unknown_characters(voice: Voice, text: str) -> str:
    """The characters of `text` the tokenizer drops (not spoken), in order of appearance; '' if none."""
    return "".join(voice.text.unknown_characters([text]))


@torch.no_grad()
def speak(voice: Voice, ids: list[int], speaker_id: int, seed: int, speaking_rate: float | None) -> Take:
    """One sentence spoken under `seed` (the same sentence and seed give the same take wherever it is in
    a list). `seconds_taken` counts the forward and the copy to the CPU, not the tokenizing."""
    model = voice.model
    kwargs: dict = {}
    if model.config.num_speakers > 1:
        kwargs["speaker_id"] = speaker_id
    if speaking_rate is not None:
        kwargs["speaking_rate"] = speaking_rate
    torch.manual_seed(seed)  # every device's generator: the noise of the duration predictor and prior
    start = time.perf_counter()
    input_ids = torch.tensor([ids], dtype=torch.long, device=voice.device)
    with bounded_durations(model):
        waveform = model(input_ids=input_ids, **kwargs).waveform[0].float().cpu().numpy()  # waits for the GPU
    return Take(waveform, time.perf_counter() - start, voice.sampling_rate)
