"""A tiny VITS configuration (about 1 M parameters) for tests, benchmarks and the demo.

Same audio front end as MMS (n_fft 1024, hop 256, 513 bins, 16 kHz), far fewer channels and layers,
so a CPU trains it in minutes. The MMS-size model is transformers' default `VitsConfig`.
"""

from __future__ import annotations

import json
from pathlib import Path

from transformers import VitsConfig, VitsModel, VitsTokenizer

from ..data.synthetic import ALPHABET

BLANK = "_"  # id 0: the blank that `add_blank` intersperses, as in MMS vocabularies


def tiny_config(
    vocab_size: int, num_speakers: int = 1, sampling_rate: int = 16000, **overrides
) -> VitsConfig:
    settings = dict(
        vocab_size=vocab_size,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        ffn_dim=128,
        flow_size=64,
        spectrogram_bins=513,
        upsample_initial_channel=64,
        upsample_rates=[8, 8, 4],
        upsample_kernel_sizes=[16, 16, 8],
        resblock_kernel_sizes=[3, 5],
        resblock_dilation_sizes=[[1, 3], [1, 3]],
        prior_encoder_num_flows=2,
        prior_encoder_num_wavenet_layers=2,
        posterior_encoder_num_wavenet_layers=4,
        duration_predictor_filter_channels=64,
        duration_predictor_num_flows=2,
        depth_separable_num_layers=2,
        layerdrop=0.0,
        num_speakers=num_speakers,
        speaker_embedding_size=16 if num_speakers > 1 else 0,
        sampling_rate=sampling_rate,
        pad_token_id=0,
    )
    settings.update(overrides)
    return VitsConfig(**settings)


def make_tokenizer(out_dir: str | Path, characters: str = ALPHABET + " ") -> VitsTokenizer:
    """A character tokenizer shaped like MMS's: blank at id 0, `add_blank`, lower-casing normaliser."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    vocab = {BLANK: 0}
    for ch in characters:
        vocab.setdefault(ch, len(vocab))
    vocab_file = out_dir / "vocab.json"
    vocab_file.write_text(json.dumps(vocab, ensure_ascii=False, indent=1), encoding="utf-8")
    tokenizer = VitsTokenizer(
        str(vocab_file), pad_token=BLANK, unk_token=BLANK, add_blank=True, normalize=True, phonemize=False
    )
    tokenizer.save_pretrained(out_dir)
    return tokenizer


def make_tiny_model(
    out_dir: str | Path, characters: str = ALPHABET + " ", num_speakers: int = 1, seed: int = 0, **overrides
) -> Path:
    """Save a freshly initialised tiny VitsModel (VITS's own initialisation, fresh_init.py) and its
    tokenizer to `out_dir`; return the path."""
    import torch

    from .fresh_init import init_like_vits

    out_dir = Path(out_dir)
    tokenizer = make_tokenizer(out_dir, characters)
    torch.manual_seed(seed)
    model = VitsModel(tiny_config(len(tokenizer), num_speakers=num_speakers, **overrides))
    init_like_vits(model)
    model.save_pretrained(out_dir)
    return out_dir
