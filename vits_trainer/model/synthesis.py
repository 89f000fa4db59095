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
import re
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

# characters spoken in one forward: a longer text is spoken in pieces, sentence by sentence. The text
# encoder's attention grows with the square of its tokens and the decoder's activations with the audio:
# 2,845 characters in one forward took 2.6 GB with the tiny model, ~18,000 were killed for memory. 400 is
# ~25 s of speech, beyond the clips a model trains on (at most 20 s by default)
PIECE_CHARS = 400
PIECE_GAP_SECONDS = 0.2  # silence between the pieces of a long text, as between two sentences
# where a sentence ends (a space follows); else where a clause or a word does
SENTENCE_END = re.compile(r"(?<=[.!?;:\u2026\u061f\u3002\u0964])\s+")
CLAUSE_END = re.compile(r"(?<=[,\u060c\u3001])\s+")

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


def encode_sentence(voice: Voice, text: str, where: str) -> list[list[int]]:
    """The token ids of each piece of `text` (pieces_of) that has something to speak; a sentence with
    nothing the tokenizer knows is an error naming `where`."""
    tokenizer = voice.text.tokenizer
    filler = {tokenizer.pad_token_id, tokenizer.unk_token_id}  # the blank between characters, unknowns
    pieces = [voice.text.encode(piece) for piece in pieces_of(text)]
    pieces = [ids for ids in pieces if not all(i in filler for i in ids)]  # e.g. a piece of digits alone
    if not pieces:
        shown = text if len(text) <= 60 else text[:57] + "..."
        raise UserError(
            f"{where}: {shown!r} has no character this model's vocabulary knows, nothing to speak"
        )
    return pieces


def pieces_of(text: str, limit: int = PIECE_CHARS) -> list[str]:
    """`text` as pieces of at most `limit` characters, spoken one after another: whole when it fits,
    else its sentences, as many in a piece as fit; a longer sentence is cut at its clauses, a longer
    clause between words, a longer word (a script written without spaces) where the limit falls."""
    if len(text) <= limit:
        return [text]
    units: list[str] = []
    for sentence in SENTENCE_END.split(text.strip()):
        for clause in CLAUSE_END.split(sentence):
            if len(clause) <= limit:
                units.append(clause)
            else:
                units += [word[i : i + limit] for word in clause.split() for i in range(0, len(word), limit)]
    pieces: list[str] = []
    for unit in units:
        if pieces and len(pieces[-1]) + 1 + len(unit) <= limit:
            pieces[-1] += " " + unit
        else:
            pieces.append(unit)
    return pieces


def unknown_characters(voice: Voice, text: str) -> str:
    """The characters of `text` the tokenizer drops (not spoken), in order of appearance; '' if none."""
    return "".join(voice.text.unknown_characters([text]))


@torch.no_grad()
def speak(
    voice: Voice, pieces: list[list[int]], speaker_id: int, seed: int, speaking_rate: float | None
) -> Take:
    """One sentence spoken under `seed` (the same sentence and seed give the same take wherever it is in
    a list), from its pieces' token ids (encode_sentence), one forward each, joined by a short silence.
    `seconds_taken` counts the forwards and the copies to the CPU, not the tokenizing."""
    model = voice.model
    kwargs: dict = {}
    if model.config.num_speakers > 1:
        kwargs["speaker_id"] = speaker_id
    if speaking_rate is not None:
        kwargs["speaking_rate"] = speaking_rate
    torch.manual_seed(seed)  # every device's generator: the noise of the duration predictor and prior
    gap = np.zeros(round(PIECE_GAP_SECONDS * voice.sampling_rate), dtype=np.float32)
    start = time.perf_counter()
    waveforms = []
    for ids in pieces:
        input_ids = torch.tensor([ids], dtype=torch.long, device=voice.device)
        with bounded_durations(model):
            waveform = model(input_ids=input_ids, **kwargs).waveform[0]
        waveform = waveform.float().cpu().numpy()  # waits for the GPU
        waveforms += [gap, waveform] if waveforms else [waveform]
    return Take(np.concatenate(waveforms), time.perf_counter() - start, voice.sampling_rate)
