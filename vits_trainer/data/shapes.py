"""Padded lengths from a small fixed set, so that batch shapes repeat from step to step.

A length-bucketed batch padded to its own longest clip has a new shape almost every step. On a GPU a
new shape costs host time: cuDNN chooses its algorithms again, the caching allocator looks for new
blocks, a compiled graph is compiled again. With `PadLengths`, a batch's token and frame counts are
padded up to the next bucket edge instead. The edges keep the top 4 bits of a length (8 edges per
octave: ..., 64, 72, 80, ..., 120, 128, 144, ...), so padding adds at most 1/8 to a length and a
corpus of 1-15 s clips meets a few dozen shapes in a whole run.

Padding hardly changes a loss: every part of the step masks by the true lengths. The one trace: the
longest clip's last two spectrogram frames see zeros past its end where the STFT's reflect padding
would have been.
"""

from __future__ import annotations

from dataclasses import dataclass

SIGNIFICANT_BITS = 4  # 8 edges per octave: at most 12.5 % added to a length


def bucket_edge(n: int) -> int:
    """The smallest bucket edge >= n (n itself up to 16, then multiples of 2, 4, 8, ... per octave)."""
    n = int(n)
    if n <= 1 << SIGNIFICANT_BITS:
        return max(n, 0)
    step = 1 << ((n - 1).bit_length() - SIGNIFICANT_BITS)
    return -(-n // step) * step


@dataclass(frozen=True)
class PadLengths:
    """How wide a batch is padded: tokens to a bucket edge, audio to a bucket edge of frames."""

    hop: int  # audio samples per spectrogram frame

    def text(self, tokens: int) -> int:
        return bucket_edge(tokens)

    def audio(self, samples: int) -> int:
        frames = -(-int(samples) // self.hop)
        return bucket_edge(frames) * self.hop


def padded_widths(pad: PadLengths | None, text_max: int, audio_max: int) -> tuple[int, int]:
    """(tokens, samples) a batch whose longest item has `text_max` tokens and `audio_max` samples is
    padded to: the bucket edges with `pad`, the longest item itself without."""
    if pad is None:
        return text_max, audio_max
    return pad.text(text_max), pad.audio(audio_max)
