"""Shared fixtures: generated corpora and tiny models, made fresh in temp folders (no binary fixtures)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from vits_trainer.training.runtime import available_cpus  # noqa: E402 (found through the entry above)

# Never reach for the network from a test: hub ids must fail fast and clearly.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


# pytest-xdist runs the suite in one worker per CPU (pyproject.toml's addopts): each worker's torch and
# numba get their share of the CPUs, set before either loads (in-process runs and the CLIs' subprocesses
# read it). Two workers of 2 threads on 2 cores spun their OpenMP threads against each other; the tiny
# models step as fast on 1 thread as on 2.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
if _WORKERS > 1:
    _SHARE = str(max(1, available_cpus() // _WORKERS))
    os.environ.setdefault("OMP_NUM_THREADS", _SHARE)
    os.environ.setdefault("NUMBA_NUM_THREADS", _SHARE)

MAX_WORKERS = 4  # each worker holds torch and a run (~1-2 GB), and some tests start 2-process runs


@pytest.hookimpl(optionalhook=True)  # xdist's hook: pytest without the plugin (a GPU machine) runs too
def pytest_xdist_auto_num_workers(config) -> int:
    """`-n auto`: one worker per CPU this process may use, at most MAX_WORKERS."""
    return min(available_cpus(), MAX_WORKERS)


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
