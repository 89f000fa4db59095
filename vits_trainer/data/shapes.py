"""Padded lengths from a small fixed set, so that batch shapes repeat from step to step.

A length-bucketed batch padded to its own longest clip has a new shape almost every step. On a GPU a
new shape costs host time: cuDNN chooses its algorithms again, the caching allocator looks for new
blocks, a compiled graph is compiled again. With `PadLengths`, a batch's token and frame counts are
padded up to the next bucket edge instead. The edges keep the top 4 bits of a length (8 edges per
octave: ..., 64, 72, 80, ..., 120, 128, 144, ...), so padding adds at most 1/8 to a length.

The token width also follows the frame width (`PadLengths.for_items`): a batch whose frames pad to an
edge pads its tokens to at least the most tokens of any clip at or below that edge. Token and frame
counts each met a few dozen edges, and a run met most of their pairs as its own shape (72 over three
epochs of an LJSpeech-sized corpus at batch 32); tied, a run meets one shape per frame edge (17).
Under CUDA graphs each new pair of lengths is a new path of graphs, run once to warm up and once more
to record (model/compiled.py), slow steps. The cost: more padded tokens (35 % -> 61 % there; a few clips with
far more tokens than their length widen their edge and those above), for the text encoder and
duration predictor only, ~14 % of an eager step's kernel time on an H200
(`python bench/bench_shapes.py`, docs/performance.md).

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
    """How wide a batch is padded: tokens to a bucket edge, audio to a bucket edge of frames, and
    tokens to at least `token_widths`' width for that frame edge."""

    hop: int  # audio samples per spectrogram frame
    # (frame edge, token width) pairs: the bucket edge of the most tokens of any clip at or below it
    token_widths: tuple[tuple[int, int], ...] = ()

    @classmethod
    def for_items(cls, hop: int, token_counts, audio_lengths) -> PadLengths:
        """Bucket edges for a training set: each frame edge's token width is the edge of the most
        tokens of any clip at or below that frame edge. A batch (or a micro-batch cut from it) holds
        only such clips, so its shape follows from its frame edge alone."""
        widest: dict[int, int] = {}
        for tokens, samples in zip(token_counts, audio_lengths, strict=True):
            edge = bucket_edge(-(-int(samples) // hop))
            widest[edge] = max(widest.get(edge, 0), int(tokens))
        widths, most = [], 0
        for edge in sorted(widest):
            most = max(most, widest[edge])
            widths.append((edge, bucket_edge(most)))
        return cls(hop, tuple(widths))

    def text(self, tokens: int, audio_width: int = 0) -> int:
        """Tokens padded to a bucket edge, and to the frame edge's token width (`audio_width`: the
        batch's padded audio samples, 0 for none)."""
        tied = dict(self.token_widths).get(audio_width // self.hop, 0) if audio_width else 0
        return max(bucket_edge(tokens), tied)

    def audio(self, samples: int) -> int:
        frames = -(-int(samples) // self.hop)
        return bucket_edge(frames) * self.hop


def padded_widths(pad: PadLengths | None, text_max: int, audio_max: int) -> tuple[int, int]:
    """(tokens, samples) a batch whose longest item has `text_max` tokens and `audio_max` samples is
    padded to: the bucket edges with `pad`, the longest item itself without."""
    if pad is None:
        return text_max, audio_max
    audio_width = pad.audio(audio_max)
    return pad.text(text_max, audio_width), audio_width
