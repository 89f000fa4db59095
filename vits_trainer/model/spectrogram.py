"""Spectrograms on the training device, always in float32.

The posterior encoder reads a linear magnitude spectrogram; the reconstruction loss compares log-mel
spectrograms. Half-precision STFTs fail or lose accuracy (cuFFT half needs power-of-two sizes, there
is no bf16 FFT), so both run with autocast disabled on float32 input.
"""

from __future__ import annotations

import math

import librosa
import torch
from torch import nn


class SpectrogramFrontEnd(nn.Module):
    """Linear and log-mel spectrograms as VITS computes them (reflect padding, `center=False`).

    With padding (n_fft - hop) / 2 on each side and `center=False`, a clip of S samples gives exactly
    S // hop frames, so frame lengths are `audio_lengths // hop_length`.
    """

    def __init__(
        self,
        sample_rate: int,
        n_fft: int = 1024,
        hop_length: int = 256,
        win_length: int | None = None,
        n_mels: int = 80,
        fmin: float = 0.0,
        fmax: float | None = None,
    ):
        super().__init__()
        self.sample_rate = sample_rate
        self.n_fft = n_fft
        self.hop_length = hop_length
        self.win_length = win_length or n_fft
        self.n_mels = n_mels
        self.register_buffer("window", torch.hann_window(self.win_length), persistent=False)
        mel = librosa.filters.mel(sr=sample_rate, n_fft=n_fft, n_mels=n_mels, fmin=fmin, fmax=fmax)  # slaney
        self.register_buffer("mel_basis", torch.from_numpy(mel).float(), persistent=False)

    @classmethod
    def from_vits_config(cls, config, n_mels: int = 80) -> SpectrogramFrontEnd:
        """Sizes from the model: bins = n_fft/2 + 1, hop = product of the decoder's upsampling rates."""
        n_fft = (config.spectrogram_bins - 1) * 2
        hop = math.prod(config.upsample_rates)
        return cls(config.sampling_rate, n_fft=n_fft, hop_length=hop, n_mels=n_mels)

    @property
    def bins(self) -> int:
        return self.n_fft // 2 + 1

    def linear(self, audio: torch.Tensor) -> torch.Tensor:
        """[B, 1, S] or [B, S] audio -> [B, n_fft/2+1, S // hop] magnitude spectrogram (float32)."""
        with torch.autocast(device_type=audio.device.type, enabled=False):
            audio = audio.float()
            if audio.dim() == 3:
                audio = audio.squeeze(1)
            pad = (self.n_fft - self.hop_length) // 2
            audio = nn.functional.pad(audio.unsqueeze(1), (pad, pad), mode="reflect").squeeze(1)
            stft = torch.stft(
                audio,
                self.n_fft,
                hop_length=self.hop_length,
                win_length=self.win_length,
                window=self.window,
                center=False,
                return_complex=True,
            )
            # the small floor keeps the sqrt's gradient finite at exact zeros (padding, digital silence)
            return torch.sqrt(stft.real.square() + stft.imag.square() + 1e-6)

    def mel_from_linear(self, spectrogram: torch.Tensor) -> torch.Tensor:
        with torch.autocast(device_type=spectrogram.device.type, enabled=False):
            mel = torch.matmul(self.mel_basis, spectrogram.float())
            return torch.log(torch.clamp(mel, min=1e-5))

    def mel(self, audio: torch.Tensor) -> torch.Tensor:
        """[B, 1, S] audio -> [B, n_mels, S // hop] log-mel spectrogram (float32)."""
        return self.mel_from_linear(self.linear(audio))
