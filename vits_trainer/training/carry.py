"""What a resume brings along and sets aside.

From a checkpoint in another folder: the history of the run up to that checkpoint (metrics.jsonl,
samples) and its best model. The case it is for: an earlier session's output attached read-only to a
new Kaggle session, resumed with --resume <copy>/step_N --checkpoint_dir <writable>. The source is only
read; nothing the new folder holds is replaced.

From an older checkpoint of the same folder: the later checkpoints, another future than the resumed
one, are moved to abandoned/ (kept). And whatever the checkpoint, a best_model/ that scored better than
anything the checkpoint knows (exported after it, by the future it left or a session killed before its
next checkpoint) stays the best to beat: best_model.best_model_score reads its score, and
outputs.RunOutputs.keep_better_best_model keeps it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from ..jsonfile import strict_json
from .best_model import existing_best_model, install_best_model
from .checkpoint_names import list_checkpoints, step_of
from .report import REFERENCE_FOLDER, read_metrics


def carry_history(source: Path, folder: Path, step: int, saved: float, log) -> None:
    """`folder`'s metrics.jsonl and samples/ start with `source`'s up to the checkpoint (its `step`, saved
    at time `saved`; what the source's run did after it is another future), so report.html and the
    loss curve show the whole run. Only into a folder with no metrics of its own."""
    metrics = source / "metrics.jsonl"
    if source.resolve() == folder.resolve() or (folder / "metrics.jsonl").exists() or not metrics.is_file():
        return
    kept = []
    for record in read_metrics(metrics):
        if record.get("event") == "session" and record.get("time", 0) > saved:
            break  # a later session of the source's run: another future than this resume's
        if record.get("step", 0) <= step:
            kept.append(record)
    folder.mkdir(parents=True, exist_ok=True)
    lines = (strict_json(record, ensure_ascii=False) + "\n" for record in kept)  # as MetricsLog writes them
    (folder / "metrics.jsonl").write_text("".join(lines), encoding="utf-8")
    carried = 0
    samples = source / "samples"
    for sub in sorted(samples.iterdir()) if samples.is_dir() else []:
        sample_step = step_of(sub.name)
        wanted = sub.name == REFERENCE_FOLDER or (sample_step is not None and sample_step <= step)
        if sub.is_dir() and wanted and not (folder / "samples" / sub.name).exists():
            shutil.copytree(sub, folder / "samples" / sub.name)
            carried += 1
    log(f"history: {len(kept)} metric records and {carried} sample folders carried over from {source}")


def carry_best_model(source: Path, folder: Path, best_model_step: int | None, log) -> None:
    """`source`'s best_model/ into `folder` when it holds the checkpoint's best weights (`best_model_step`:
    a later session there may have exported another), so the new folder's best model is the run's best
    rather than none until an evaluation beats it. Which weights it holds: its marker's step, or for an
    export made before markers had one, the step the source run's train_summary.json names."""
    if best_model_step is None or source.resolve() == folder.resolve() or (folder / "best_model").exists():
        return
    found = existing_best_model(source, best_model_step)
    if found is None:
        return
    best, step = found
    if step is None:  # an export made before markers had a step
        try:
            summary = json.loads((source / "train_summary.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return  # no summary (a killed session): which weights best_model/ holds is not known
        step = summary.get("best_model_step") if isinstance(summary, dict) else None
    if step != best_model_step:
        return
    install_best_model(best, folder, best_model_step)  # now this run's export: its later bests replace it
    log(f"history: best_model (step {best_model_step}) carried over from {best}")


ABANDONED = "abandoned"  # in the checkpoint folder: checkpoints of a future a resume left


def set_aside_later_checkpoints(folder: Path, resumed: Path, step: int, log) -> None:
    """`resumed` (step `step`) is an older checkpoint of `folder`, or one set aside in its abandoned/: the
    later checkpoints of `folder` go to `folder`/abandoned/, so that --resume auto continues the resumed
    run, not the one it left, and pruning never keeps them in place of the resumed run's own. Moved,
    never deleted."""
    if resumed.parent.resolve() not in (folder.resolve(), (folder / ABANDONED).resolve()):
        return
    later = [p for p in list_checkpoints(folder) if step_of(p.name) > step]
    if not later:
        return
    aside = folder / ABANDONED
    aside.mkdir(exist_ok=True)
    for path in later:
        target, n = aside / path.name, 1
        while target.exists():  # a future left twice at the same step
            n += 1
            target = aside / f"{path.name}-{n}"
        path.rename(target)
    names = ", ".join(p.name for p in reversed(later))
    log(
        f"resume: from step {step}, an older checkpoint: the later {names} moved to {aside} (kept); "
        "--resume auto continues from here"
    )
