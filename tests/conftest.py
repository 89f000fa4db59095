"""Shared fixtures: generated corpora and tiny models, made fresh in temp folders (no binary fixtures)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
# Never reach for the network from a test: hub ids must fail fast and clearly.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """A freshly initialised tiny single-speaker VitsModel + tokenizer for the tone language."""
    from vits_trainer.model.tiny import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("tiny_model"))


@pytest.fixture(scope="session")
def tone_corpus(tmp_path_factory) -> Path:
    """A prepared training folder (wavs/ + metadata.csv) of 40 tone-language clips at 16 kHz."""
    from vits_trainer.data.synthetic import make_corpus

    out = tmp_path_factory.mktemp("tone_corpus")
    make_corpus(out, num_clips=40, sample_rate=16000, seed=0)
    return out
