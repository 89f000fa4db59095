"""vits_trainer.data.audio: decoding every supported format, downmix, resampling accuracy, atomic 16-bit writes."""

from __future__ import annotations

import numpy as np
import pytest
import soundfile as sf

from vits_trainer.data.audio import (
    AudioReadError,
    audio_duration,
    is_temp_wav,
    read_audio,
    resample,
    write_wav,
)


def sine(freq: float, seconds: float, rate: int, amp: float = 0.5) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    return (amp * np.sin(2 * np.pi * freq * t)).astype(np.float32)


def peak_hz(audio: np.ndarray, rate: int) -> float:
    spectrum = np.abs(np.fft.rfft(audio * np.hanning(len(audio))))
    return float(np.fft.rfftfreq(len(audio), 1 / rate)[np.argmax(spectrum)])


@pytest.mark.parametrize(
    ("name", "subtype", "tolerance"),
    [
        ("a.wav", "PCM_16", 1e-4),
        ("a.wav", "PCM_24", 1e-6),
        ("a.wav", "FLOAT", 0.0),
        ("a.flac", "PCM_16", 1e-4),
        ("a.ogg", "VORBIS", None),
        ("a.mp3", "MPEG_LAYER_III", None),
    ],
)
def test_read_formats_as_float32_mono(tmp_path, name, subtype, tolerance):
    rate = 22050
    x = sine(440, 0.5, rate)
    path = tmp_path / name
    sf.write(path, x, rate, subtype=subtype)
    audio, got_rate = read_audio(path)
    assert got_rate == rate
    assert audio.dtype == np.float32 and audio.ndim == 1
    if tolerance is not None:  # lossless: sample-exact up to the format's precision
        assert len(audio) == len(x)
        assert np.max(np.abs(audio - x)) <= tolerance + 1e-7
    else:  # lossy codecs add padding/delay; the tone must survive
        assert abs(len(audio) - len(x)) < 0.1 * rate
        assert abs(peak_hz(audio, rate) - 440) < 5


def test_read_from_bytes_and_stereo_downmix(tmp_path):
    rate = 16000
    left, right = sine(300, 0.3, rate, 0.6), sine(300, 0.3, rate, 0.2)
    path = tmp_path / "stereo.flac"
    sf.write(path, np.stack([left, right], axis=1), rate)
    audio, _ = read_audio(path.read_bytes())
    np.testing.assert_allclose(audio, (left + right) / 2, atol=1e-4)
    both, _ = read_audio(path, mono=False)
    assert both.shape == (len(left), 2)


def test_read_mp3_bytes(tmp_path):
    path = tmp_path / "a.mp3"
    sf.write(path, sine(440, 1.0, 16000), 16000)
    audio, rate = read_audio(path.read_bytes())
    assert rate == 16000 and abs(peak_hz(audio, rate) - 440) < 5


@pytest.mark.parametrize("content", [b"", b"this is not audio at all", b"RIFF\x00\x00"])
def test_unreadable_input_raises_audio_read_error(tmp_path, content):
    path = tmp_path / "bad.wav"
    path.write_bytes(content)
    with pytest.raises(AudioReadError):
        read_audio(path)
    with pytest.raises(AudioReadError):
        read_audio(content)
    assert audio_duration(path) is None


@pytest.mark.parametrize(("orig", "target"), [(22050, 16000), (44100, 16000), (16000, 22050), (48000, 24000)])
def test_resample_keeps_length_and_pitch(orig, target):
    x = sine(440, 2.0, orig)
    y = resample(x, orig, target)
    assert y.dtype == np.float32
    assert abs(len(y) - len(x) * target / orig) <= 2
    assert abs(peak_hz(y, target) - 440) < 1.0
    # Amplitude survives (HQ passband is flat at 440 Hz); compare away from the edges.
    mid = y[len(y) // 4 : 3 * len(y) // 4]
    assert abs(np.max(np.abs(mid)) - 0.5) < 0.01


def test_resample_same_rate_is_identity():
    x = sine(100, 0.1, 16000)
    assert resample(x, 16000, 16000) is x


def test_write_wav_is_16bit_mono_clipped_and_atomic(tmp_path):
    path = tmp_path / "out.wav"
    x = np.array([0.0, 0.5, -0.5, 1.5, -2.0], dtype=np.float32)
    size = write_wav(path, x, 16000)
    info = sf.info(path)
    assert (info.samplerate, info.channels, info.subtype) == (16000, 1, "PCM_16")
    assert size == path.stat().st_size
    back, _ = sf.read(path, dtype="int16")
    assert back.tolist() == [0, 16384, -16384, 32767, -32767]
    assert [p.name for p in tmp_path.iterdir()] == ["out.wav"]  # no temp file left behind


def test_write_wav_failure_leaves_no_partial_file(tmp_path):
    path = tmp_path / "out.wav"
    with pytest.raises(Exception):  # noqa: B017 - any error from the writer is fine, the cleanup is tested
        write_wav(path, np.zeros(10, dtype=np.float32), 0)
    assert list(tmp_path.iterdir()) == []


def test_temp_wav_names():
    from pathlib import Path

    assert is_temp_wav(Path(".clip1.wav.1234.tmp"))
    assert not is_temp_wav(Path("clip1.wav"))
    assert not is_temp_wav(Path(".notes.tmp"))
