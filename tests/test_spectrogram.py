"""The spectrogram front end against an independent librosa/numpy computation, and its float32 promise."""

from __future__ import annotations

import librosa
import numpy as np
import pytest
import torch
from transformers import VitsConfig

from vits_trainer.model.spectrogram import SpectrogramFrontEnd
from vits_trainer.model.tiny import tiny_config

SR, N_FFT, HOP = 16000, 1024, 256


@pytest.fixture(scope="module")
def frontend() -> SpectrogramFrontEnd:
    return SpectrogramFrontEnd(SR, n_fft=N_FFT, hop_length=HOP, n_mels=80)


def noise_batch(lengths: list[int], seed: int = 0) -> torch.Tensor:
    """[B, 1, max] speech-level noise; items shorter than the longest are zero-padded."""
    rng = np.random.default_rng(seed)
    audio = np.zeros((len(lengths), 1, max(lengths)), dtype=np.float32)
    for i, n in enumerate(lengths):
        audio[i, 0, :n] = 0.3 * rng.standard_normal(n)
    return torch.from_numpy(audio)


def reference_linear(audio: np.ndarray, n_fft: int = N_FFT, hop: int = HOP) -> np.ndarray:
    """VITS's spectrogram, computed in float64 with numpy + librosa only."""
    pad = (n_fft - hop) // 2
    padded = np.pad(audio.astype(np.float64), (pad, pad), mode="reflect")
    # librosa's "hann" is the periodic (fftbins=True) window, as torch.hann_window's default
    stft = librosa.stft(padded, n_fft=n_fft, hop_length=hop, window="hann", center=False)
    return np.sqrt(stft.real**2 + stft.imag**2 + 1e-6)


@pytest.mark.parametrize("samples", [400, 1023, 1024, 8191, 8192, 16000, 48_123])
def test_frames_are_samples_floor_hop(frontend: SpectrogramFrontEnd, samples: int) -> None:
    spec = frontend.linear(noise_batch([samples]))
    assert spec.shape == (1, N_FFT // 2 + 1, samples // HOP)
    assert frontend.mel(noise_batch([samples])).shape == (1, 80, samples // HOP)


def test_frames_for_another_hop() -> None:
    fe = SpectrogramFrontEnd(SR, n_fft=512, hop_length=128)
    for samples in (300, 4097, 12_345):
        assert fe.linear(noise_batch([samples])).shape == (1, 257, samples // 128)


def test_linear_matches_librosa(frontend: SpectrogramFrontEnd) -> None:
    audio = noise_batch([12_000, 7_777], seed=1)
    spec = frontend.linear(audio)
    assert spec.dtype == torch.float32
    for i in range(audio.size(0)):
        expected = reference_linear(audio[i, 0].numpy())
        np.testing.assert_allclose(spec[i].numpy(), expected, rtol=1e-4, atol=1e-4)
    # [B, S] input is the same as [B, 1, S]
    torch.testing.assert_close(frontend.linear(audio.squeeze(1)), spec, rtol=0, atol=0)


def test_linear_matches_librosa_for_a_nonstandard_size() -> None:
    fe = SpectrogramFrontEnd(22050, n_fft=512, hop_length=128)
    audio = noise_batch([5000], seed=2)
    np.testing.assert_allclose(
        fe.linear(audio)[0].numpy(), reference_linear(audio[0, 0].numpy(), 512, 128), rtol=1e-4, atol=1e-4
    )


def test_log_mel_matches_librosa_slaney_basis(frontend: SpectrogramFrontEnd) -> None:
    audio = noise_batch([10_000], seed=3)
    linear = reference_linear(audio[0, 0].numpy())
    basis = librosa.filters.mel(sr=SR, n_fft=N_FFT, n_mels=80, fmin=0.0, fmax=None, htk=False, norm="slaney")
    expected = np.log(np.maximum(basis.astype(np.float64) @ linear, 1e-5))
    mel = frontend.mel(audio)
    assert mel.dtype == torch.float32
    np.testing.assert_allclose(mel[0].numpy(), expected, rtol=1e-4, atol=1e-4)
    # mel_from_linear is the same function applied to a given linear spectrogram
    torch.testing.assert_close(frontend.mel_from_linear(frontend.linear(audio)), mel, rtol=0, atol=0)


def test_log_mel_floor_on_silence(frontend: SpectrogramFrontEnd) -> None:
    mel = frontend.mel(torch.zeros(1, 1, 4096))
    # silence is sqrt(1e-6) = 1e-3 in every bin, so each channel is log(max(1e-3 * its filter sum, 1e-5))
    basis = librosa.filters.mel(sr=SR, n_fft=N_FFT, n_mels=80)
    expected = np.log(np.maximum(1e-3 * basis.astype(np.float64).sum(1), 1e-5))
    assert np.isfinite(mel.numpy()).all()
    np.testing.assert_allclose(mel[0].numpy(), np.repeat(expected[:, None], mel.size(-1), 1), rtol=1e-5)


def test_gradient_is_finite_on_digital_silence(frontend: SpectrogramFrontEnd) -> None:
    audio = torch.zeros(1, 1, 4096, requires_grad=True)
    frontend.mel(audio).sum().backward()
    assert torch.isfinite(audio.grad).all()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_input_gives_float32(frontend: SpectrogramFrontEnd, dtype: torch.dtype) -> None:
    audio = noise_batch([6000], seed=4)
    half = audio.to(dtype)
    spec, mel = frontend.linear(half), frontend.mel(half)
    assert spec.dtype == torch.float32 and mel.dtype == torch.float32
    # computed from the (rounded) half values in float32: identical to the float32 path on them
    torch.testing.assert_close(spec, frontend.linear(half.float()), rtol=0, atol=0)
    assert frontend.mel_from_linear(spec.to(dtype)).dtype == torch.float32


def test_float32_under_bf16_autocast(frontend: SpectrogramFrontEnd) -> None:
    audio = noise_batch([6000], seed=5)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        # sanity: autocast really is on (a matmul would come out bf16)
        assert torch.matmul(torch.ones(2, 2), torch.ones(2, 2)).dtype == torch.bfloat16
        spec, mel = frontend.linear(audio), frontend.mel(audio)
        mel_bf16_in = frontend.mel_from_linear(spec.bfloat16())
    assert spec.dtype == mel.dtype == mel_bf16_in.dtype == torch.float32
    # autocast must not have lowered the precision of the mel projection
    torch.testing.assert_close(mel, frontend.mel(audio), rtol=0, atol=0)
    torch.testing.assert_close(spec, frontend.linear(audio), rtol=0, atol=0)


def test_from_vits_config_reads_bins_and_upsampling() -> None:
    config = VitsConfig(spectrogram_bins=257, upsample_rates=[4, 4, 4, 4], sampling_rate=22050)
    fe = SpectrogramFrontEnd.from_vits_config(config)
    assert (fe.n_fft, fe.hop_length, fe.win_length, fe.sample_rate, fe.bins) == (512, 256, 512, 22050, 257)
    assert fe.window.shape == (512,) and fe.mel_basis.shape == (80, 257)

    mms = SpectrogramFrontEnd.from_vits_config(VitsConfig())  # MMS: 513 bins, upsampling 8*8*2*2
    assert (mms.n_fft, mms.hop_length, mms.sample_rate) == (1024, 256, 16000)
    tiny = SpectrogramFrontEnd.from_vits_config(tiny_config(vocab_size=10))  # upsampling 8*8*4
    assert (tiny.n_fft, tiny.hop_length) == (1024, 256)
    # the spectrogram has the bins the model's posterior encoder expects
    assert fe.linear(noise_batch([3000])).size(1) == config.spectrogram_bins


def test_sine_peaks_at_its_bin(frontend: SpectrogramFrontEnd) -> None:
    t = np.arange(SR) / SR
    audio = torch.from_numpy((0.5 * np.sin(2 * np.pi * 440.0 * t)).astype(np.float32)).view(1, 1, -1)
    spec = frontend.linear(audio)[0]
    expected_bin = round(440.0 * N_FFT / SR)  # 28.16 -> 28
    # the first and last frames see the reflect padding (a phase kink) and may leak a bin over
    assert (spec[:, 1:-1].argmax(0) == expected_bin).all()
    assert spec.mean(1).argmax() == expected_bin
    # nearly all the energy is within a few bins of it (hann main lobe)
    energy = spec.square().sum(1)
    near = energy[expected_bin - 3 : expected_bin + 4].sum()
    assert near / energy.sum() > 0.99
    # and the strongest mel channel is the one whose filter weights that bin most
    mel = frontend.mel(audio)[0]
    assert (mel[:, 1:-1].argmax(0) == frontend.mel_basis[:, expected_bin].argmax()).all()
