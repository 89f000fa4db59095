"""Audio file I/O for data preparation: decode anything libsndfile reads, resample, write 16-bit WAV.

numpy + soundfile + soxr only (no torch, no ffmpeg): soundfile >= 0.12 bundles a libsndfile that
decodes WAV (int16/int24/int32/float), FLAC, OGG/Vorbis/Opus and MP3, from a path or from bytes.
"""

from __future__ import annotations

import io
import os
import struct
import wave
from pathlib import Path

import numpy as np
import soundfile as sf
import soxr

# Extensions treated as audio when scanning folders (all decodable by the bundled libsndfile).
AUDIO_EXTENSIONS = (".wav", ".flac", ".ogg", ".opus", ".mp3")
# soxr "HQ": 20-bit precision, ~95% passband; transparent for speech and fast.
RESAMPLE_QUALITY = "HQ"


class AudioReadError(Exception):
    """The file or bytes could not be decoded as audio; the message says why (one line)."""


def read_audio(source: str | Path | bytes, mono: bool = True) -> tuple[np.ndarray, int]:
    """Decode `source` (a path or the bytes of an audio file) to float32 in [-1, 1] and its rate.

    Returns shape (frames,) when `mono` (channels averaged), else (frames, channels).
    Raises AudioReadError for anything that is not decodable audio.
    """
    handle = io.BytesIO(source) if isinstance(source, (bytes, bytearray)) else source
    try:
        audio, rate = sf.read(handle, dtype="float32", always_2d=True)
    except Exception as err:  # libsndfile reports corrupt/non-audio data in several exception types
        message = _one_line(err)
        if handle is not source:  # bytes: libsndfile names the BytesIO by its address ("<_io.BytesIO ...>")
            message = message.replace(repr(handle), "the audio bytes")
        raise AudioReadError(message) from None
    return (to_mono(audio) if mono else audio), int(rate)


def audio_duration(path: str | Path) -> float | None:
    """Duration in seconds from the file header only (cheap), or None when the header is unreadable.

    MP3 lengths are estimates; callers use this only to skip decoding files far outside a limit.
    """
    try:
        info = sf.info(str(path))
    except Exception:
        return None
    return info.frames / info.samplerate if info.samplerate > 0 else None


def wav_header_seconds(path: str | Path) -> float | None:
    """The length a WAV's header gives (its data chunk's size), or None when it gives none (not a WAV, a
    streamed size of 0 or 0xFFFFFFFF). libsndfile reports the length of the samples present, so a WAV
    cut short (a copy that stopped midway) never looked shorter than its header: its data chunk says."""
    chunk = wav_data_chunk(path)
    if chunk is None:
        return None
    size, rate, block, _ = chunk
    return None if size in (0, 0xFFFFFFFF) or not rate or not block else size // block / rate


def wav_data_chunk(path: str | Path) -> tuple[int, int, int, int] | None:
    """(data size its header gives, sample rate, bytes per frame, where the samples start) of a WAV
    file; None when it is no WAV or has no data chunk."""
    try:
        with open(path, "rb") as f:
            head = f.read(12)
            if len(head) < 12 or head[:4] not in (b"RIFF", b"RIFX") or head[8:12] != b"WAVE":
                return None
            order = ">" if head[:4] == b"RIFX" else "<"
            rate = block = 0
            while len(chunk := f.read(8)) == 8:
                name, size = chunk[:4], struct.unpack(f"{order}I", chunk[4:])[0]
                if name == b"data":
                    return size, rate, block, f.tell()
                body = f.read(min(size, 64)) if name == b"fmt " else b""
                if len(body) >= 14:
                    rate = struct.unpack(f"{order}I", body[4:8])[0]
                    block = struct.unpack(f"{order}H", body[12:14])[0]
                f.seek(size - len(body) + (size & 1), os.SEEK_CUR)  # chunks are padded to an even size
    except OSError:
        return None
    return None


def to_mono(audio: np.ndarray) -> np.ndarray:
    """Average the channels of a (frames, channels) array; 1-D input is returned unchanged."""
    if audio.ndim == 1:
        return audio.astype(np.float32, copy=False)
    if audio.shape[1] == 1:
        return np.ascontiguousarray(audio[:, 0], dtype=np.float32)
    return audio.mean(axis=1, dtype=np.float32)


def resample(audio: np.ndarray, orig_rate: int, target_rate: int) -> np.ndarray:
    """Band-limited resampling of mono float audio; the length becomes n * target / orig (+-1 sample)."""
    if orig_rate == target_rate or audio.shape[0] == 0:
        return audio.astype(np.float32, copy=False)
    return soxr.resample(
        audio.astype(np.float32, copy=False), orig_rate, target_rate, quality=RESAMPLE_QUALITY
    )


def write_wav(path: str | Path, audio: np.ndarray, sample_rate: int) -> int:
    """Write mono 16-bit PCM WAV atomically (temp file in the same folder + rename); return its size.

    Samples are clipped to [-1, 1] first: resampling can overshoot full scale slightly, and
    libsndfile's float-to-int conversion does not clip by default.
    """
    path = Path(path)
    pcm = np.round(np.clip(audio, -1.0, 1.0) * 32767.0).astype(np.int16)
    # A per-process temp name so parallel workers never share one; a leading dot hides it from globs.
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        # The stdlib writer: a plain 44-byte header + samples, much faster than libsndfile for short clips.
        # the file opened first: wave's own open, failing, left a half-made writer that complained at exit
        with open(tmp, "wb") as f, wave.open(f, "wb") as w:
            w.setnchannels(1)
            w.setsampwidth(2)
            w.setframerate(int(sample_rate))
            w.writeframes(pcm.astype("<i2", copy=False).tobytes())
        os.replace(tmp, path)  # `path`: the caller's output (prepare: only WAVs it owns, safety.py)
    except BaseException:
        tmp.unlink(missing_ok=True)  # our pid's temp file
        raise
    return path.stat().st_size


def is_temp_wav(path: Path) -> bool:
    """True for a temp file left by an interrupted `write_wav`."""
    return path.name.startswith(".") and path.name.endswith(".tmp") and ".wav." in path.name


def _one_line(err: BaseException) -> str:
    text = " ".join(str(err).split()) or type(err).__name__
    return text[:300]
