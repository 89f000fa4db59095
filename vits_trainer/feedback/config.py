"""A feedback run's settings: train_vits.py's TrainConfig plus the feedback inputs, and the flags it hides.

Apart from round.py so that the replay data (replay.py) can name its settings without importing the
round that uses it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from ..errors import UserError
from ..training.config import TrainConfig, _f

MIN_HELD_OUT_CLIPS = 5  # fewer usable feedback clips: evaluate on all of them, and train on them too
# settings a feedback run derives or does not support: hidden from its command line (a version is worth
# sharing only once promoted, which is decided after the loop's export: push vN/model by hand)
HIDDEN_FLAGS = (
    "model_name",
    "checkpoint_dir",
    "max_samples",
    "extend_vocab",
    "demo",
    "overwrite_output_dir",
    "push_to_hub",
    "hub_public",
    "push_best",
)


@dataclass
class FeedbackConfig(TrainConfig):
    """TrainConfig plus the feedback inputs; model_name/checkpoint_dir are derived per version."""

    hidden_flags: ClassVar[tuple[str, ...]] = HIDDEN_FLAGS

    base_model: str = _f(
        "training/checkpoints/best_model",
        "the model to improve: a folder from train_vits.py or an earlier feedback run "
        "(e.g. training/feedback_models/latest)",
    )
    feedback_dir: str = _f(
        "feedback", "feedback clips: wavs/ + metadata.csv, made with prepare_data.py --data_dir FEEDBACK"
    )
    replay_ratio: float = _f(
        1.0, "original training clips replayed per feedback clip, drawn afresh every epoch (0 = none)"
    )
    max_regression: float = _f(
        0.02, "promote only if the original validation mel got at most this much worse (0.02 = 2 %%)"
    )
    sample_sentences: int = _f(
        50, "feedback sentences synthesised to WAV before and after, held-out ones first (0 = none)"
    )
    feedback_val_fraction: float = _f(
        0.2,
        f"feedback clips held out for the before/after comparison (with fewer than {MIN_HELD_OUT_CLIPS} "
        "clips, or 0: all of them are evaluated and also trained on)",
    )
    # --- runner settings with other defaults or meanings here ---
    output_dir: str = _f(
        "training/feedback_models",
        "versions v1, v2, ... (model/, checkpoints/, feedback_report.json); latest.json names the current one",
    )
    val_fraction: float = _f(
        0.02,
        "only when the base model has no recorded split: the --val_fraction it was trained with "
        "(its held-out split is then recomputed with --seed)",
    )
    target_hours: float = _f(0.5, "wall-clock budget of this process, start-up to exit included")
    learning_rate: float = _f(
        1e-5, "peak learning rate (lower than a first fine-tuning: the model is already trained)"
    )
    save_minutes: float = _f(10.0, "checkpoint at least this often (and at epoch ends, overhead permitting)")
    resume: str = _f(
        "auto",
        "auto (continue the newest version if it is unfinished, else start a new one) | none (always a "
        "new version) | PATH of a checkpoint folder inside a version",
    )

    def validate(self) -> None:
        super().validate()
        if not (math.isfinite(self.replay_ratio) and self.replay_ratio >= 0):
            raise UserError(f"--replay_ratio must be 0 or more (got {self.replay_ratio})")
        if not (math.isfinite(self.max_regression) and self.max_regression >= 0):
            raise UserError(f"--max_regression must be 0 or more (got {self.max_regression})")
        if self.sample_sentences < 0:
            raise UserError(f"--sample_sentences must be 0 or more (got {self.sample_sentences})")
        if not 0.0 <= self.feedback_val_fraction <= 0.5:
            raise UserError(f"--feedback_val_fraction must be in [0, 0.5] (got {self.feedback_val_fraction})")
