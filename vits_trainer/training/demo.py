"""`train_vits.py --demo`: a built-in tone-language corpus and a tiny model, trained for ~2 minutes on
CPU under training/demo/, so a fresh machine with no network shows the whole pipeline working."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from .config import TrainConfig

DEMO_ROOT = Path("training/demo")

# Settings that differ from a real fine-tuning run: a tiny model from scratch wants a higher LR and a
# short warmup; the budget is two minutes. Flags given explicitly on the command line still win.
DEMO_SETTINGS = dict(
    data_dir=str(DEMO_ROOT / "data"),
    checkpoint_dir=str(DEMO_ROOT / "checkpoints"),
    output_dir=str(DEMO_ROOT / "final_model"),
    model_name=str(DEMO_ROOT / "tiny_model"),
    target_hours=2 / 60,
    batch_size=8,
    gradient_accumulation_steps=1,
    learning_rate=2e-4,
    warmup_steps=20,
    benchmark_samples=64,
    val_fraction=0.1,
    discriminator_width=0.125,
    num_workers=0,
    save_minutes=0.5,
    log_every=5,
)


def apply_demo_settings(cfg: TrainConfig, explicit: set[str]) -> TrainConfig:
    """Demo defaults for every flag the user did not set (make_demo_inputs writes its files, once every
    check of the command line passed)."""
    changes = {k: v for k, v in DEMO_SETTINGS.items() if k not in explicit}
    return dataclasses.replace(cfg, **changes)


def made_by_demo(cfg: TrainConfig, name: str) -> bool:
    """Whether the demo supplies `name` (data_dir, model_name): a --demo run the user gave no such flag."""
    return bool(getattr(cfg, "demo", False)) and name not in (cfg.explicit or ())


def make_demo_inputs(cfg: TrainConfig) -> None:
    """The demo's corpus and model, where missing; never in a folder the user named (--data_dir,
    --model_name: theirs, used as given; a hub id was once taken for a folder to make a model in)."""
    data_dir, model_dir = Path(cfg.data_dir), Path(cfg.model_name)
    if not made_by_demo(cfg, "model_name"):  # the user's model: found (or refused) before any file is made
        from ..hub import resolve_model_dir

        resolve_model_dir(cfg.model_name)
    if made_by_demo(cfg, "data_dir") and not (data_dir / "metadata.csv").is_file():
        from ..data.synthetic import make_corpus

        print(f"demo: generating a tone-language corpus in {data_dir}", flush=True)
        make_corpus(data_dir, num_clips=160, sample_rate=16000, seed=0)
    if made_by_demo(cfg, "model_name") and not (model_dir / "config.json").is_file():
        from ..model.tiny import make_tiny_model
        from .runtime import quiet_transformers

        print(f"demo: creating a tiny VITS model in {model_dir}", flush=True)
        quiet_transformers()  # its save's progress bar, as in the rest of the run
        make_tiny_model(model_dir)
