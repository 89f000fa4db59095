"""A synthetic "tone language": speech-like audio whose text really determines the sound.

Every character is a short harmonic tone with its own pitch and length, a space is a short pause,
and speakers differ by a pitch factor. Text and audio therefore align monotonically, the way real
speech does, and a small VITS model can learn the mapping in a few hundred steps. Used by the
tests, the benchmarks and ``train_vits.py --demo``; nothing here needs a network or a binary file.
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import soundfile as sf

from .prepare_state import mark_as_made

ALPHABET = "abcdefghijklmno"
PAUSE_SECONDS = 0.06
EDGE_SECONDS = 0.08  # silence before and after each clip, as in real recordings
NOISE_LEVEL = 2e-3  # a quiet noise floor: real recordings are never digitally silent


def char_tone(index: int) -> tuple[float, float]:
    """(fundamental frequency in Hz, duration in s) of the character at `index` in the alphabet."""
    f0 = 130.0 * 2.0 ** (index / 7.0)  # about 130 Hz up to ~530 Hz for 15 letters
    seconds = 0.07 + 0.025 * (index % 4)
    return f0, seconds


def synth_text(
    text: str, sample_rate: int = 16000, speaker: int = 0, alphabet: str = ALPHABET, seed: int = 0
) -> np.ndarray:
    """Render `text` as float32 mono audio in [-1, 1]. Characters outside `alphabet` are pauses."""
    rng = np.random.default_rng(seed)
    pitch = 1.0 + 0.12 * speaker
    edge = np.zeros(int(EDGE_SECONDS * sample_rate), dtype=np.float32)
    pieces = [edge]
    for ch in text:
        idx = alphabet.find(ch)
        if idx < 0:
            pieces.append(np.zeros(int(PAUSE_SECONDS * sample_rate), dtype=np.float32))
            continue
        f0, seconds = char_tone(idx)
        n = int(seconds * sample_rate)
        t = np.arange(n, dtype=np.float64) / sample_rate
        tone = sum(np.sin(2 * np.pi * k * f0 * pitch * t) / k for k in range(1, 5))
        ramp = max(1, int(0.01 * sample_rate))
        envelope = np.ones(n)
        envelope[:ramp] = 0.5 - 0.5 * np.cos(np.linspace(0, np.pi, ramp))
        envelope[-ramp:] = envelope[:ramp][::-1]
        pieces.append((0.35 * tone * envelope).astype(np.float32))
    pieces.append(edge)
    audio = np.concatenate(pieces)
    audio += (NOISE_LEVEL * rng.standard_normal(audio.shape[0])).astype(np.float32)
    return np.clip(audio, -1.0, 1.0).astype(np.float32)


def random_sentence(
    rng: np.random.Generator, alphabet: str = ALPHABET, min_words: int = 2, max_words: int = 5
) -> str:
    words = []
    for _ in range(int(rng.integers(min_words, max_words + 1))):
        length = int(rng.integers(2, 6))
        words.append("".join(alphabet[int(i)] for i in rng.integers(0, len(alphabet), length)))
    return " ".join(words)


def make_corpus(
    out_dir: str | Path,
    num_clips: int = 40,
    sample_rate: int = 16000,
    num_speakers: int = 1,
    seed: int = 0,
    alphabet: str = ALPHABET,
    id_prefix: str = "clip",
    min_words: int = 2,
    max_words: int = 5,
) -> list[dict]:
    """Write `out_dir/wavs/<id>.wav` (16-bit PCM) and `out_dir/metadata.csv` (`id|text|speaker`).

    This is the layout prepare_data.py produces and train_vits.py reads. Returns the rows written.
    """
    out_dir = Path(out_dir)
    (out_dir / "wavs").mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(num_clips):
        text = random_sentence(rng, alphabet, min_words, max_words)
        speaker = i % num_speakers
        clip_id = f"{id_prefix}{i:05d}"
        audio = synth_text(text, sample_rate, speaker, alphabet, seed=seed * 100003 + i)
        sf.write(out_dir / "wavs" / f"{clip_id}.wav", audio, sample_rate, subtype="PCM_16")
        rows.append({"id": clip_id, "text": text, "speaker": str(speaker)})
    # a generated corpus (tests, --demo only when its metadata.csv is missing)
    with open(out_dir / "metadata.csv", "w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f, delimiter="|", quoting=csv.QUOTE_NONE, escapechar="\\", lineterminator="\n")
        for row in rows:
            writer.writerow([row["id"], row["text"], row["speaker"]])
    mark_as_made(out_dir, "generated")  # as prepare_data.py's folders are: the clip cache may go in it
    return rows
