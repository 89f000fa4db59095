"""The best_model/ folder of a run's checkpoint folder: which step's weights it holds
(`existing_best_model`), their score (`best_model_score`), and an export copied into it
(`install_best_model`). Read at set-up (carry.py), during the loop (outputs.py) and at the end
(run_end.py); an evaluation's own export into it is outputs.RunOutputs.export_best.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from ..safety import check_replaceable, marker_step, read_marker, replace_export, write_marker
from .report import read_metrics


def install_best_model(exported: Path, checkpoint_dir: Path, step: int) -> Path:
    """A copy of the export `exported` (the weights of training `step`) as `<checkpoint_dir>/best_model`,
    marked as this run's; it replaces only an earlier export there (our marker, nothing the user put in
    it). Raises OSError/UnsafeOverwrite."""
    best = checkpoint_dir / "best_model"
    check_replaceable(best)
    tmp = best.with_name(f".best_model.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)  # this pid's temp folder
    shutil.copytree(exported, tmp)
    write_marker(tmp, "best_model", checkpoint_dir, step)
    replace_export(tmp, best)
    return best


def existing_best_model(checkpoint_dir: Path, best_model_step: int | None) -> tuple[Path, int | None] | None:
    """(`<checkpoint_dir>/best_model`, the step its marker records) when this run exported one and it is
    complete (exports are renamed into place whole, so a folder with its weights is complete); else None.
    The start evaluation measures the model the run started from and exports nothing: a run whose
    evaluations never beat it has no best_model. The marker's step is the folder's own, which a
    checkpoint's `best_model_step` may miss (an export after the last checkpoint of a killed session, a
    final copy that failed after the final checkpoint named it); None for an export made before markers
    had one, whose step each caller takes from what it has."""
    folder = checkpoint_dir / "best_model"
    if best_model_step is None or not (folder / "config.json").is_file():
        return None
    if not (folder / "model.safetensors").is_file():
        return None
    return folder, marker_step(read_marker(folder))


def best_model_score(folder: Path, key: str) -> tuple[int, float] | None:
    """(step, its `key` score) of the best_model/ in checkpoint folder `folder`: the step its marker
    records and that step's evaluation in metrics.jsonl (the lowest, if it has several); None when the
    folder, its step or the score is missing."""
    best = folder / "best_model"
    step = marker_step(read_marker(best)) if (best / "model.safetensors").is_file() else None
    if step is None:
        return None
    scores = [
        r[key]
        for r in read_metrics(folder / "metrics.jsonl")
        if r.get("event") == "eval" and r.get("step") == step and isinstance(r.get(key), (int, float))
    ]
    return (step, min(scores)) if scores else None
