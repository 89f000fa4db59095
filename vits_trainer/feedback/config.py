"""A feedback run's settings: train_vits.py's TrainConfig plus the feedback inputs, the flags it hides,
and the folders they name, checked before any work (check_feedback_paths).

Apart from round.py so that the replay data (replay.py) can name its settings without importing the
round that uses it.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from ..errors import UserError
from ..safety import check_output_vs_data, inside, refuse, resolved
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
        nonempty="auto, none or a checkpoint folder inside a version (an empty value would name the current "
        "folder)",
    )

    def validate(self, resumed: bool = False, final: bool = True) -> None:
        super().validate(resumed, final)
        if not (math.isfinite(self.replay_ratio) and self.replay_ratio >= 0):
            raise UserError(f"--replay_ratio must be 0 or more (got {self.replay_ratio})")
        if not (math.isfinite(self.max_regression) and self.max_regression >= 0):
            raise UserError(f"--max_regression must be 0 or more (got {self.max_regression})")
        if self.sample_sentences < 0:
            raise UserError(f"--sample_sentences must be 0 or more (got {self.sample_sentences})")
        if not 0.0 <= self.feedback_val_fraction <= 0.5:
            raise UserError(f"--feedback_val_fraction must be in [0, 0.5] (got {self.feedback_val_fraction})")


def check_base_model_folder(value: str) -> Path:
    """--base_model: an existing folder with a config.json; the usual wrong guesses (the versions' root,
    a version folder, latest.json) get the folder to pass instead."""
    base = Path(value).expanduser()
    if base.is_file():
        if base.name == "latest.json":
            instead = f"; pass {base.with_name('latest')}"
        elif (base.parent / "config.json").is_file():  # a file of the model (its weights): its folder
            instead = f"; pass {base.parent if base.parent != Path('.') else Path.cwd()}"
        else:
            instead = ""
        raise UserError(f"--base_model {base}: is a file, not a model folder{instead}")
    if not base.is_dir():
        # <output_dir>/latest before any round was promoted (the documented next round's command after
        # a first round that was not): "no such folder" said nothing of which model is current
        unpromoted = _not_promoted_yet(base.parent) if base.name == "latest" and not base.is_symlink() else ""
        raise UserError(
            f"--base_model {base}: no such folder"
            + (unpromoted or " (the model to improve, e.g. training/checkpoints/best_model)")
        )
    if not (base / "config.json").is_file():
        if (base / "latest").exists() or (base / "latest.json").is_file():
            instead = f"; the current model of these feedback versions is {base / 'latest'}"
        elif (base / "model" / "config.json").is_file():
            instead = f"; this version's model is {base / 'model'}"
        else:
            instead = _not_promoted_yet(base)
        raise UserError(f"--base_model {base}: not a model folder (no config.json){instead}")
    return base


def _not_promoted_yet(root: Path) -> str:
    """'; no version ... promoted yet ...' when `root` holds feedback versions and no `latest`: the current
    model is then the base model their newest round started from; '' otherwise."""
    from .versions import LATEST_JSON, REPORT_NAME, RUN_NAME, list_versions

    versions = list_versions(root)
    if not versions or (root / LATEST_JSON).exists():
        return ""
    files = [version / name for _, version in reversed(versions) for name in (REPORT_NAME, RUN_NAME)]
    base = next(filter(None, map(_base_model_in, files)), None)  # the newest version's that says
    current = f": the current model is still the base model, {base}; pass it" if base else ""
    return f"; no feedback version in {root} has been promoted yet, so there is no latest{current}"


def _base_model_in(path: Path) -> str | None:
    """The base_model a version's report or run file names, None when it names none or cannot be read."""
    try:
        return json.loads(path.read_text(encoding="utf-8")).get("base_model")
    except (OSError, ValueError, AttributeError):
        return None


def check_feedback_paths(cfg) -> None:
    """train_feedback.py: --data_dir and --feedback_dir are read, --base_model is read, and the output
    root receives new version folders vN/ and the latest pointer."""
    if getattr(cfg, "explicit", None) is None or "base_model" in cfg.explicit:
        # first: a wrong folder is the message, not an overlap. One a resumed version takes from its
        # checkpoint (the printed resume command gives none) is checked once its settings are read
        check_base_model_folder(cfg.base_model)
    root = cfg.output_dir
    check_output_vs_data("--output_dir", root, "--data_dir", cfg.data_dir)
    check_output_vs_data("--output_dir", root, "--feedback_dir", cfg.feedback_dir)
    base, r = resolved(cfg.base_model), resolved(root)
    if inside(r, base):
        refuse(
            "--output_dir", root, r, "is inside", "--base_model", cfg.base_model, base, "it must stay a model"
        )
    if inside(base, r) and base != r:
        # the documented rounds: <root>/latest (-> vK/model) or <root>/vK/model of a finished version
        rel = base.relative_to(r).parts
        finished = len(rel) == 2 and rel[1] == "model" and (r / rel[0] / "feedback_report.json").is_file()
        if not (finished or rel == ("latest",)):
            refuse(
                "--base_model",
                cfg.base_model,
                base,
                "is inside",
                "--output_dir",
                root,
                r,
                "only <output_dir>/latest or <output_dir>/vN/model of a finished version can be a base",
            )
    elif base == r:
        refuse(
            "--base_model",
            cfg.base_model,
            base,
            "is the same folder as",
            "--output_dir",
            root,
            r,
            "the versions would be written into the model folder",
        )
    pointer = r / "latest.json"
    if pointer.exists():
        try:
            ours = {"version", "relative_path"} <= set(json.loads(pointer.read_text(encoding="utf-8")))
        except (OSError, ValueError, TypeError):
            ours = False
        if not ours:
            raise UserError(
                f"--output_dir {root}: {pointer} is not a pointer written by train_feedback.py; "
                f"move it away or choose another --output_dir (it would be replaced)"
            )
